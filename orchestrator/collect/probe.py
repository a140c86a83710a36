"""Read one export's small metadata tables (map step): who wrote it, when, on which GPU.

Only tiny tables are read here with Python's sqlite3; the event tables are streamed by
`ingest`. Every failure becomes a `Probe` with `error` set, never an exception, so one bad
rank cannot stop a collect of hundreds.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator import numbers
from orchestrator.store.tables import EVENT_TABLES, TABLES

# Launcher/Slurm variables kept in the store; everything else nsys captured (tokens,
# passwords, cloud keys) is dropped unless --keep-env.
ENV_ALLOW = re.compile(
    r"^(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|ROLE_RANK|"
    r"ROLE_WORLD_SIZE|ROLE_NAME|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_[A-Z_]+|ORCH_JOB_ID|"
    r"SLURM_(JOB_ID|JOBID|PROCID|LOCALID|NODEID|NNODES|NTASKS|JOB_NODELIST|NODELIST|"
    r"JOB_NUM_NODES|STEP_ID|ARRAY_TASK_ID|JOB_NAME|JOB_PARTITION|CLUSTER_NAME|TOPOLOGY_ADDR)|"
    r"CUDA_VISIBLE_DEVICES|NVIDIA_VISIBLE_DEVICES|OMP_NUM_THREADS|HOSTNAME)$"
)
__all__ = ["ENV_ALLOW", "EVENT_TABLES", "Probe", "open_ro", "probe"]


@dataclass
class Probe:
    path: Path
    error: str | None = None
    tables: dict[str, set[str]] = field(default_factory=dict)  # table -> column names
    session_start_ns: int | None = None
    nsys_version: str | None = None
    schema_version: str | None = None
    host: str | None = None
    pid: int | None = None
    gpu_name: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # captured env (all of it, in memory)
    notes: list[str] = field(default_factory=list)
    string_ids_unique: bool = True  # False: StringIds ids repeat (join on a deduplicated copy)
    command: tuple[str, ...] = ()  # captured command line (compared across ranks, never stored)
    untraced: list[str] = field(default_factory=list)  # store tables whose source table is absent

    def has(self, table: str, column: str | None = None) -> bool:
        cols = self.tables.get(table)
        return cols is not None and (column is None or column in cols)


def _kv(con: sqlite3.Connection, table: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in con.execute(f'SELECT name, value FROM "{table}"')}


def open_ro(path: Path, **kw: object) -> sqlite3.Connection:
    """Read-only, by path: the URI comes from `Path.as_uri()`, which percent-encodes `#`, `?`
    and `%` in folder and file names (a URI pasted from the name would read another file).
    Text is decoded with U+FFFD for invalid UTF-8: a trace string never fails a read."""
    uri = Path(path).resolve().as_uri() + "?mode=ro&immutable=1"
    con = sqlite3.connect(uri, uri=True, **kw)  # type: ignore[arg-type]
    con.text_factory = numbers.decode
    return con


def probe(path: Path) -> Probe:
    p = Probe(path=path)
    try:
        if path.stat().st_size == 0:
            p.error = "empty file (0 bytes): the rank's export failed or was interrupted"
            return p
        with open(path, "rb") as fh:
            if fh.read(16) != b"SQLite format 3\x00":
                p.error = "not a SQLite file: re-export it with `nsys export --type sqlite`"
                return p
        con = open_ro(path)
        con.text_factory = bad_text = numbers.CountingDecoder()
        try:
            _read(con, p)
        finally:
            con.close()
        if bad_text.bad:
            p.notes.append(f"invalid UTF-8 in {bad_text.bad} metadata string(s) replaced with U+FFFD")
    except sqlite3.DatabaseError as e:
        p.error = f"unreadable SQLite ({e}): the file is truncated or corrupt; re-export the report"
    except OSError as e:
        p.error = f"cannot read file ({e.strerror})"
    except Exception as e:
        p.error = f"unexpected content ({type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''})"
    return p


def _read(con: sqlite3.Connection, p: Probe) -> None:
    # Every table's columns in one query, not a PRAGMA per table (an export has ~55-80 tables):
    # each SQLite call is a GIL handoff, so fewer calls probe faster (docs/benchmarks-code.md).
    for t, col in con.execute(
        "SELECT m.name, c.name FROM sqlite_master AS m LEFT JOIN pragma_table_info(m.name) AS c "
        "WHERE m.type = 'table'"
    ):
        cols = p.tables.setdefault(t, set())
        if col is not None:
            cols.add(col)
    # No integrity scan here (it would read every page): a truncated file fails on the first
    # page it lacks, either below or in ingest, and the rank is marked with that error.
    meta_table = next((t for t in ("META_DATA_EXPORT", "EXPORT_META_DATA") if t in p.tables), None)
    if meta_table is None or "TARGET_INFO_SESSION_START_TIME" not in p.tables:
        p.error = ("not an Nsight Systems export (no META_DATA_EXPORT/EXPORT_META_DATA or "
                   "TARGET_INFO_SESSION_START_TIME table)")
        return
    meta = _kv(con, meta_table)
    p.nsys_version = meta.get("EXPORT_PRODUCT_VERSION")
    p.schema_version = meta.get("EXPORT_SCHEMA_VERSION")
    row = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
    p.session_start_ns, bad = numbers.optional(numbers.epoch_ns, row[0] if row else None, "utcEpochNs")
    if bad:
        p.error = f"TARGET_INFO_SESSION_START_TIME: {bad}: cannot place this rank on the shared clock"
        return
    if p.session_start_ns is None:
        p.error = "TARGET_INFO_SESSION_START_TIME is empty: cannot place this rank on the shared clock"
        return
    if "META_DATA_CAPTURE" in p.tables:
        args: list[tuple[int, str]] = []
        for name, value in con.execute(
            "SELECT name, value FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT_VARIABLE' "
            "OR name LIKE 'PROCESS_0:COMMAND' OR name LIKE 'PROCESS_0:ARGUMENT_%'"
        ):
            name, value = str(name), str(value)
            if name.endswith("ENVIRONMENT_VARIABLE"):
                key, _, val = value.partition("=")
                p.env[key] = val.strip('"')
            else:
                n = name.rpartition("_")[2]
                args.append((int(n) if n.isascii() and n.isdigit() else -1, value))
        p.command = tuple(v for _, v in sorted(args))
    else:
        p.notes.append("no META_DATA_CAPTURE (nsys < 2023?): rank identity from file name only")
    if "TARGET_INFO_SYSTEM_ENV" in p.tables:
        r = con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name='Hostname' LIMIT 1").fetchone()
        p.host = r[0] if r else None
    if "PROCESSES" in p.tables:
        rows = con.execute("SELECT pid, name FROM PROCESSES WHERE pid IS NOT NULL").fetchall()
        py = [r for r in rows if r[1] and "python" in str(r[1]).lower()]
        pick = (py or rows or [None])[0]
        p.pid, bad = numbers.optional(numbers.pid, pick[0] if pick else None, "PROCESSES.pid")
        if bad:
            p.notes.append(f"{bad}: pid not stored")
    if p.has("TARGET_INFO_GPU", "name"):
        r = con.execute("SELECT name FROM TARGET_INFO_GPU ORDER BY id LIMIT 1").fetchone()
        p.gpu_name = r[0] if r else None
    if "StringIds" in p.tables:
        _check_string_ids(con, p)
    elif "CUPTI_ACTIVITY_KIND_KERNEL" in p.tables:
        p.notes.append("no StringIds table: kernel and API names are NULL, kernels unclassifiable")
    p.untraced = [t for t, src in EVENT_TABLES.items() if src not in p.tables]
    absent = [(t, src) for t, src in EVENT_TABLES.items() if src not in p.tables and TABLES[t].noted]
    if absent:
        p.notes.append(f"no {', '.join(src for _, src in absent)} table(s): "
                       f"{', '.join(t for t, _ in absent)} empty for this rank")


def _check_string_ids(con: sqlite3.Connection, p: Probe) -> None:
    """nsys declares `id INTEGER PRIMARY KEY` (unique by construction, nothing to scan);
    a table without that key is checked, and repeated ids are joined deduplicated."""
    info = con.execute('PRAGMA table_info("StringIds")').fetchall()
    if any(r[1] == "id" and r[5] == 1 and str(r[2]).upper() == "INTEGER" for r in info):
        return
    if not p.has("StringIds", "id") or not p.has("StringIds", "value"):
        p.string_ids_unique = True
        p.notes.append("StringIds lacks id/value columns: names are NULL")
        p.tables.pop("StringIds", None)
        return
    dup = con.execute("SELECT count(*) - count(DISTINCT id) FROM StringIds").fetchone()[0]
    if dup:
        p.string_ids_unique = False
        p.notes.append(f"StringIds repeats {dup} id(s): each id's first value (lowest) used, rows not multiplied")
