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

# Launcher/Slurm variables kept in the store; everything else nsys captured (tokens,
# passwords, cloud keys) is dropped unless --keep-env.
ENV_ALLOW = re.compile(
    r"^(RANK|LOCAL_RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|GROUP_WORLD_SIZE|ROLE_RANK|"
    r"ROLE_WORLD_SIZE|ROLE_NAME|MASTER_ADDR|MASTER_PORT|TORCHELASTIC_[A-Z_]+|ORCH_JOB_ID|"
    r"SLURM_(JOB_ID|JOBID|PROCID|LOCALID|NODEID|NNODES|NTASKS|JOB_NODELIST|NODELIST|"
    r"JOB_NUM_NODES|STEP_ID|ARRAY_TASK_ID|JOB_NAME|JOB_PARTITION|CLUSTER_NAME|TOPOLOGY_ADDR)|"
    r"CUDA_VISIBLE_DEVICES|NVIDIA_VISIBLE_DEVICES|OMP_NUM_THREADS|HOSTNAME)$"
)
EVENT_TABLES = {
    "kernels": "CUPTI_ACTIVITY_KIND_KERNEL",
    "memcpy": "CUPTI_ACTIVITY_KIND_MEMCPY",
    "memset": "CUPTI_ACTIVITY_KIND_MEMSET",
    "cuda_api": "CUPTI_ACTIVITY_KIND_RUNTIME",
    "nvtx": "NVTX_EVENTS",
    "gpu_metrics": "GPU_METRICS",
}


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

    def has(self, table: str, column: str | None = None) -> bool:
        cols = self.tables.get(table)
        return cols is not None and (column is None or column in cols)


def _kv(con: sqlite3.Connection, table: str) -> dict[str, str]:
    return {str(k): str(v) for k, v in con.execute(f'SELECT name, value FROM "{table}"')}


def _open_ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)


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
        con = _open_ro(path)
        try:
            _read(con, p)
        finally:
            con.close()
    except sqlite3.DatabaseError as e:
        p.error = f"unreadable SQLite ({e}): the file is truncated or corrupt; re-export the report"
    except OSError as e:
        p.error = f"cannot read file ({e.strerror})"
    return p


def _read(con: sqlite3.Connection, p: Probe) -> None:
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    for t in names:
        p.tables[t] = {r[1] for r in con.execute(f'PRAGMA table_info("{t}")')}
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
    p.session_start_ns = int(row[0]) if row and row[0] is not None else None
    if p.session_start_ns is None:
        p.error = "TARGET_INFO_SESSION_START_TIME is empty: cannot place this rank on the shared clock"
        return
    if "META_DATA_CAPTURE" in p.tables:
        for (value,) in con.execute(
            "SELECT value FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT_VARIABLE'"
        ):
            key, _, val = str(value).partition("=")
            p.env[key] = val.strip('"')
    else:
        p.notes.append("no META_DATA_CAPTURE (nsys < 2023?): rank identity from file name only")
    if "TARGET_INFO_SYSTEM_ENV" in p.tables:
        r = con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV WHERE name='Hostname' LIMIT 1").fetchone()
        p.host = r[0] if r else None
    if "PROCESSES" in p.tables:
        rows = con.execute("SELECT pid, name FROM PROCESSES WHERE pid IS NOT NULL").fetchall()
        py = [r for r in rows if r[1] and "python" in str(r[1]).lower()]
        pick = (py or rows or [None])[0]
        p.pid = int(pick[0]) if pick else None
    if p.has("TARGET_INFO_GPU", "name"):
        r = con.execute("SELECT name FROM TARGET_INFO_GPU ORDER BY id LIMIT 1").fetchone()
        p.gpu_name = r[0] if r else None
    absent = [(t, src) for t, src in EVENT_TABLES.items() if src not in p.tables and t != "gpu_metrics"]
    if absent:
        p.notes.append(f"no {', '.join(src for _, src in absent)} table(s): "
                       f"{', '.join(t for t, _ in absent)} empty for this rank")
