"""Build the merged DuckDB store from per-rank SQLite exports (the reduce step).

Ranks are streamed into DuckDB in batches, by parallel workers that insert straight into the
store file's event tables (created up front; no staging copy, so the rows are written once and
never held in memory as a whole), either through DuckDB's sqlite scanner (fast path; the
extension is loaded from the pinned `duckdb-extension-sqlite-scanner` wheel, never downloaded)
or through sqlite3 -> Arrow batches (fallback). The store is built under a temp name and
renamed over the old one, so readers only ever see a complete store (store.py); until then
`writing_store` holds it open, for an analysis in the same process (`orch analyze`).
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from importlib import resources
from pathlib import Path

import duckdb

from orchestrator import numbers
from orchestrator.collect.extract import insert_sql, missing_columns, select_sql
from orchestrator.collect.finalize import finalize_store
from orchestrator.collect.identity import Layout, Member
from orchestrator.collect.pipeline import Written
from orchestrator.collect.probe import open_ro
from orchestrator.collect.store import Checkpoint, first_line, new_store, store_write_failed, write_meta
from orchestrator.duckdb_memory import limit
from orchestrator.errors import OrchError
from orchestrator.sqltext import attach, detach, load, set_option
from orchestrator.store.schema import (
    EVENT_SCHEMA,
    RANKS_DDL,
    align_clocks_sql,
    arrow_schema,
    create_event_tables_sql,
)
from orchestrator.timings import phase

_FETCH_ROWS = 65536


def scanner_extension_path() -> Path | None:
    """The sqlite scanner shipped in the PyPI wheel for exactly this DuckDB version."""
    try:
        base = resources.files("duckdb_extension_sqlite_scanner")
    except ModuleNotFoundError:
        return None
    p = Path(str(base)) / "extensions" / f"v{duckdb.__version__}" / "sqlite_scanner.duckdb_extension"
    return p if p.is_file() else None


# For the connections that LOAD the scanner (give as `config=` to duckdb.connect). DuckDB's
# signature check re-hashes the whole extension file on every load, which costs more than
# ingesting a small rank's kernels (docs/benchmarks-code.md). The file is the one inside the installed
# duckdb-extension-sqlite-scanner wheel, found by path (never downloaded), trusted as duckdb's
# own library beside it is; and these connections never install an extension from the network.
SCANNER_CONFIG = {"allow_unsigned_extensions": "true", "autoinstall_known_extensions": "false"}


def load_scanner(con: duckdb.DuckDBPyConnection) -> bool:
    ext = scanner_extension_path()
    if ext is None:
        return False
    try:
        load(con, ext)
        return True
    except duckdb.InterruptException:  # Ctrl-C during the load: stop, not a fallback engine
        raise KeyboardInterrupt from None
    except duckdb.Error:
        return False


def _ingest_scanner(con: duckdb.DuckDBPyConnection, batch: list[tuple[Member, int]], worker: int) -> None:
    """Ranks of one batch in ONE transaction, inserted one after the other into the store's
    event tables: a failing rank rolls the whole batch back, and DuckDB appends of concurrent
    transactions never conflict, each committed as one contiguous run of rows (so a rank's
    rows stay contiguous, as the zone maps on `rank` want). (Not one UNION ALL across ranks:
    DuckDB 1.5.5 answered such a query with the first attached file's rows for every branch.)
    Aliases are positions in the batch (never a number from the trace), and every ATTACH is
    undone whatever fails, so a bad rank leaves nothing behind for the next one. ATTACH takes
    no bound parameter: the absolute path goes in as a quoted literal (a plain path, not a
    URI, so `#`, `?` and `%` in names are just characters). The aliases carry the worker's
    number: attached databases are shared by the workers' cursors."""
    aliases = [f"src_w{worker}_{i}" for i in range(len(batch))]
    try:
        for (m, _), alias in zip(batch, aliases, strict=True):
            path = str(Path(m.report.sqlite).resolve())  # type: ignore[arg-type]
            attach(con, path, alias, sqlite=True, read_only=True)
        con.execute("BEGIN")
        try:
            for table in EVENT_SCHEMA:
                for (m, off), alias in zip(batch, aliases, strict=True):
                    sql = select_sql(table, m.probe, m.rank, off, f"{alias}.", alias)  # type: ignore[arg-type]
                    if sql:
                        with phase(f"ingest: {table}"):
                            con.execute(insert_sql(table, table, sql))
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    finally:
        for alias in aliases:
            with contextlib.suppress(duckdb.Error):
                detach(con, alias)


def arrow_batches(rows: sqlite3.Cursor, table: str) -> Iterator:
    """sqlite3 rows as Arrow batches of `table`'s schema, a fetch at a time: a rank's table is
    never held whole (the in-process fallback and the map's Parquet writer both stream these)."""
    import pyarrow as pa

    schema = arrow_schema(table)
    while chunk := rows.fetchmany(_FETCH_ROWS):
        cols = list(zip(*chunk, strict=False))
        yield pa.RecordBatch.from_arrays(
            [pa.array(c, type=f.type) for c, f in zip(cols, schema, strict=False)], schema=schema
        )


def _ingest_sqlite3(con: duckdb.DuckDBPyConnection, batch: list[tuple[Member, int]], worker: int) -> None:
    """Fallback without the extension: SQLite runs the same SELECTs, Arrow batches carry the
    rows to DuckDB (bounded memory: never a whole table in Python), into the store's tables
    in one transaction per batch as on the scanner path (`worker` is unused here: a
    registered view belongs to its cursor)."""
    import pyarrow as pa

    con.execute("BEGIN")
    try:
        for m, off in batch:
            # DuckDB pulls the Arrow batches from its own threads; one reader at a time.
            scon = open_ro(m.report.sqlite, check_same_thread=False)  # type: ignore[arg-type]
            scon.text_factory = bad_text = numbers.CountingDecoder()
            try:
                for table in EVENT_SCHEMA:
                    sql = select_sql(table, m.probe, m.rank, off, "")  # type: ignore[arg-type]
                    if not sql:
                        continue
                    batches = arrow_batches(scon.execute(sql), table)
                    reader = pa.RecordBatchReader.from_batches(arrow_schema(table), batches)
                    con.register("src_batches", reader)
                    try:
                        cols = ", ".join(f'"{c}"' for c, _ in EVENT_SCHEMA[table])
                        con.execute(insert_sql(table, table, f"SELECT {cols} FROM src_batches"))
                    finally:
                        con.unregister("src_batches")
            finally:
                scon.close()
            if bad_text.bad:
                m.probe.notes.append("invalid UTF-8 in trace strings replaced with U+FFFD")
        con.execute("COMMIT")
    except BaseException:
        con.execute("ROLLBACK")
        raise


_INVALID_UNICODE = re.compile(r"[Ii]nvalid unicode|UTF-?8", re.IGNORECASE)


# Ranks attached and inserted together in one transaction (BATCH), and in flight at once over
# all workers (IN_FLIGHT). Larger batches mean fewer commits and a shorter checkpoint, but every
# worker holds its batch's rows uncommitted: with many workers, more memory and a slower ingest.
# The trade-off, measured both ways: docs/benchmarks-code.md.
BATCH = 32
IN_FLIGHT = 64


def _ingest_all(con: duckdb.DuckDBPyConnection, ok: list[Member], base: int, use_scanner: bool,
                workers: int, on_rank: Callable[[Member], None] | None) -> None:
    """Batches of ranks spread over `workers` cursors (each its own transactions), all appending
    to the store's event tables, which `_build` created. A failing batch is rolled back
    and retried rank by rank so one bad file only marks its own rank as an error; its rows
    never reach the store. Impossible rows go in as they are: `finalize_store` counts them on
    their rank, then deletes them."""
    ingest = _ingest_scanner if use_scanner else _ingest_sqlite3
    for m in ok:
        gone = missing_columns(m.probe)
        if gone:
            m.probe.notes.append(f"missing columns (stored as NULL): {', '.join(gone)}")
    pairs = [(m, m.probe.session_start_ns - base) for m in ok]  # type: ignore[operator]
    # Enough batches for every worker: a 2-rank job on 2+ cores ingests both ranks at once
    # (one batch of both ingested them one after the other, on one DuckDB thread); smaller
    # batches the more workers there are (2 workers: 32 ranks a batch, 8 workers: 8).
    workers = max(1, workers)
    size = max(1, min(BATCH, IN_FLIGHT // workers, -(-len(pairs) // workers)))
    batches = [pairs[i: i + size] for i in range(0, len(pairs), size)]
    workers = max(1, min(workers, len(batches)))

    def run(cur: duckdb.DuckDBPyConnection, batch: list[tuple[Member, int]], w: int) -> None:
        try:
            ingest(cur, batch, w)
        except (duckdb.Error, sqlite3.Error, ValueError) as e:
            if store_write_failed(e):
                raise  # the store's disk, not this batch's ranks: new_store says so in one line
            if len(batch) > 1:
                for one in batch:
                    run(cur, [one], w)
                return
            m = batch[0][0]
            if use_scanner and _INVALID_UNICODE.search(str(e)):
                # DuckDB refuses invalid UTF-8; sqlite3 reads it with U+FFFD in its place.
                try:
                    _ingest_sqlite3(cur, batch, w)  # notes the replacement on the rank
                except (duckdb.Error, sqlite3.Error, ValueError) as e2:
                    m.status = "error"
                    m.notes.append(f"ingest failed: {first_line(e2)}")
            else:
                m.status = "error"
                m.notes.append(f"ingest failed: {first_line(e)}")
        if on_rank:
            for m, _ in batch:
                on_rank(m)

    def worker(w: int) -> None:
        cur = con.cursor()
        try:
            cur.execute("USE store")  # a cursor starts in the writer's in-memory catalog
            cur.execute("SET threads = 1")  # parallelism comes from the workers
            for batch in batches[w::workers]:
                run(cur, batch, w)
        finally:
            cur.close()

    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(worker, range(workers)))
    set_option(con, "threads", threads)  # `threads` is global: the workers changed it


# Rows waiting for the checkpoint stay in the writer's memory; an analysis that runs during a
# background checkpoint shares the writer's memory limit with them. Past this much WAL (more
# than small jobs write; sizes in docs/benchmarks-code.md) the checkpoint runs
# first, as `orch collect` always does, and the analysis reads the written file.
BACKGROUND_CHECKPOINT_MAX = 64 << 20


@contextmanager
def writing_store(
    members: list[Member], store: Path, *, layout: Layout, keep_env: bool = False,
    engine: str = "auto", workers: int = 2, align: bool = False,
    expected: list[int] | None = None, extra_meta: dict[str, object] | None = None,
    on_rank: Callable[[Member], None] | None = None, background: bool = False,
) -> Iterator[Written]:
    """Build `store` and hold it open: the block gets the writer (`Written`: the connection,
    its in-memory catalog the default and the store attached as `store`, and the ingest
    engine used) with every row,
    table and meta in place; when it ends the checkpoint finishes, the writer closes and the
    store is renamed into place (`new_store`). With `background` the checkpoint runs during
    the block (a small store, BACKGROUND_CHECKPOINT_MAX), so an analysis in this process
    starts at once on the same rows. A failure inside the block still keeps the store (it is
    complete) and is raised after the rename; a failure while building keeps nothing."""
    failed: BaseException | None = None
    with new_store(store) as tmp:
        con = duckdb.connect(config=SCANNER_CONFIG)
        try:
            with phase("store: create file"):
                attach(con, tmp, "store")
                con.execute("USE store")  # the build's tables; each cursor says so again (_ingest_all)
            used = _build(con, members, store, layout=layout, keep_env=keep_env, engine=engine, workers=workers,
                          align=align, expected=expected, extra_meta=extra_meta, on_rank=on_rank)
            wal = Path(f"{tmp}.wal")
            small = wal.exists() and wal.stat().st_size <= BACKGROUND_CHECKPOINT_MAX
            checkpoint = Checkpoint(con, background and small)
            try:
                yield Written(con, used)
            except BaseException as e:  # the block's own failure: the store is complete, keep it
                failed = e
            checkpoint.wait()
        finally:
            con.close()
    if failed is not None:
        raise failed


def _build(con: duckdb.DuckDBPyConnection, members: list[Member], store: Path, *, layout: Layout,
           keep_env: bool, engine: str, workers: int, align: bool, expected: list[int] | None,
           extra_meta: dict[str, object] | None, on_rank: Callable[[Member], None] | None) -> str:
    """Every table of the store, up to the checkpoint; returns the engine used."""
    set_option(con, "threads", max(1, workers))
    # The buffer pool (written blocks, the open transactions' rows) stays under this,
    # spilling to a temp directory past it instead of growing.
    limit(con, str(store.parent / ".duckdb-spill"))
    # Each batch commits its own partly filled last row groups; the checkpoint's vacuum
    # rewrites them and leaves the old blocks as free space inside the file (a larger
    # file: docs/benchmarks-code.md). The rows are the same either way; deleted
    # impossible rows (rare) stay as marked deletes instead of being compacted away.
    con.execute("SET max_vacuum_tasks = 0")
    with phase("store: load sqlite scanner"):
        use_scanner = engine in ("auto", "scanner") and load_scanner(con)
    used = "scanner" if use_scanner else "sqlite3"
    if engine == "scanner" and not use_scanner:
        raise OrchError(
            "the DuckDB sqlite scanner is not available; install duckdb-extension-sqlite-scanner"
            f"=={duckdb.__version__} or use --engine sqlite3"
        )
    con.execute(RANKS_DDL)
    con.execute(create_event_tables_sql())  # the workers insert straight into these
    ok = [m for m in members if m.status == "ok" and not m.probe.error and m.report.sqlite]
    starts = [m.probe.session_start_ns for m in ok if m.probe.session_start_ns is not None]
    base = min(starts) if starts else 0
    # No automatic checkpoint until the store is complete: a batch's rows of a table go
    # straight into the file as whole row groups when they fill one (nvtx, cuda_api), the
    # smaller tables' rows go to the WAL; each automatic checkpoint would compress the
    # partly filled last row groups of those again (CPU spent for nothing, and a bigger
    # file: docs/benchmarks-code.md). One checkpoint at the end (writing_store) writes them
    # once and removes the WAL (those rows uncompressed).
    con.execute("SET checkpoint_threshold = '1TB'")
    with phase("store: ingest (wall)"):
        _ingest_all(con, ok, base, use_scanner, workers, on_rank)
    with phase("store: finalize"):
        finalize_store(con, members, base, layout, keep_env, expected)
    if align:
        with phase("store: align clocks"):
            con.execute(align_clocks_sql())
    write_meta(con, engine=used, base=base, layout=layout, align=align, extra=extra_meta)
    return used
