"""The store file's life: built under a temp name, its small tables and meta written, its
rows checkpointed once, then renamed into place, so readers only ever see a complete store.

The in-process collect (ingest.writing_store) and the reduce of Parquet parts (reduce.py)
both build their stores through these. `Checkpoint` lets an analysis in the same process
start on the rows while the checkpoint writes them (collect.collecting).
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from orchestrator import __version__, numbers
from orchestrator.collect.decompress import clean_stale
from orchestrator.collect.identity import Layout
from orchestrator.errors import OrchError
from orchestrator.sqltext import literal
from orchestrator.store.schema import STORE_VERSION
from orchestrator.timings import phase


def first_line(e: BaseException) -> str:
    text = str(e).splitlines()
    return (text[0] if text else type(e).__name__)[:200]


@contextmanager
def new_store(store: Path) -> Iterator[Path]:
    """The path to build `store` at: a temp name renamed over the old store when the block ends
    without an error (readers only ever see a complete store), removed when it fails. Temp
    stores of earlier runs that were killed (their pid is gone) are removed first. The caller
    closes its connection inside the block."""
    if "?" in str(store.resolve()):
        # DuckDB reads `?` in a database path as the start of options and writes elsewhere.
        raise OrchError(f"cannot write a store under {numbers.text(str(store))!r}: DuckDB does not accept '?' in "
                        "the path of a database; choose an output folder without '?'")
    tmp = store.with_name(f".{store.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    clean_stale(store.parent, re.compile(re.escape(f".{store.name}.tmp-") + r"(?P<pid>[0-9]+)(\.wal)?"))
    try:
        yield tmp
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        Path(f"{tmp}.wal").unlink(missing_ok=True)
        if store_write_failed(e):
            why = _DISK_FULL.search(str(e))
            raise OrchError(f"cannot write the store in {numbers.text(str(store.parent))!r}: "
                            f"{why.group(0) if why else first_line(e)}; "
                            "free space there or pass --out DIR on a disk with room (nothing was written; "
                            "an earlier store there is kept)") from None
        raise
    os.replace(tmp, store)


def store_write_failed(e: BaseException) -> bool:
    """The store's own disk failed (full, read-only, quota), not a rank's export: DuckDB
    invalidates the database after such an error, so no other rank could be written either."""
    return isinstance(e, duckdb.FatalException) or (
        isinstance(e, duckdb.Error) and bool(_DISK_FULL.search(str(e))))


_DISK_FULL = re.compile(r"No space left on device|Disk quota exceeded|Read-only file system")


def write_meta(con: duckdb.DuckDBPyConnection, *, engine: str, base: int, layout: Layout, align: bool,
               extra: dict[str, object] | None = None) -> None:
    """The store's `meta` table: what built it, on which clock base, with which layout."""
    meta = {
        "orch_version": __version__, "store_version": STORE_VERSION,
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "engine": engine, "clock_base_utc_ns": base, "layout": json.dumps(layout.meta()),
        "aligned_collectives": align, **(extra or {}),
    }
    append_rows(con, "meta", ("key", "value"), [(k, str(v)) for k, v in meta.items()])


def append_rows(con: duckdb.DuckDBPyConnection, table: str, names: tuple[str, ...], rows: list[tuple]) -> None:
    """Insert the small tables (ranks, env, sources, meta, the parts' index) by column name,
    from a temporary JSON-lines file that DuckDB reads as the table's own column types: no
    pyarrow import (a fixed cost on every collect), no bound Python lists and no VALUES
    literals, both far slower past a few thousand rows (the parts' index of 2,048 ranks holds
    55k rows; docs/history/benchmarks-after-job.md). Strings pass through `numbers.text`: a file name
    in another encoding never fails it."""
    if not rows:
        return
    types = {name: kind for name, kind, *_ in con.execute(f"DESCRIBE {table}").fetchall()}
    fd, path = tempfile.mkstemp(prefix="orch-rows-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(dict(zip(names, map(_json_value, r), strict=True))) + "\n" for r in rows)
        quoted = ", ".join(f'"{n}"' for n in names)
        columns = "{" + ", ".join(f"{literal(n)}: {literal(types[n])}" for n in names) + "}"
        con.execute(f"INSERT INTO {table} ({quoted}) SELECT {quoted} FROM read_json({literal(path)}, "
                    f"format = 'newline_delimited', columns = {columns})")
    finally:
        os.unlink(path)


def _json_value(v: object) -> object:
    """A value as JSON writes it for DuckDB: repaired text, no NaN or infinity (NULL)."""
    if isinstance(v, str):
        return numbers.text(v)
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, list | tuple):
        return [_json_value(x) for x in v]
    return v


class Checkpoint:
    """`CHECKPOINT store` on its own cursor of the writer's connection, now or in a thread.
    In a thread, DuckDB writes the rows while other cursors read them (the analysis of
    `orch analyze`, which then does not wait for it; docs/benchmarks-code.md).
    `wait` re-raises its error (a full disk: nothing may be renamed into place)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, background: bool) -> None:
        self._cur = con.cursor()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="orch-checkpoint") if background else None
        if self._thread:
            self._thread.start()
        else:
            self._run()

    def _run(self) -> None:
        try:
            with phase("store: checkpoint"):
                self._cur.execute("CHECKPOINT store")
        except BaseException as e:  # handed to the thread that waits
            self._error = e
        finally:
            self._cur.close()

    def wait(self) -> None:
        if self._thread:
            self._thread.join()
        if self._error is not None:
            raise self._error
