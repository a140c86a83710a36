"""The per-rank Parquet layout that the map step writes and the reduce (or any engine) reads.

    <run>/parts/
        table=<table>/rank=<N>/<id>.parquet       one file per report and event table
        table=map_stack/rank=<N>/<id>.parquet     the rank's statistics computed in the map, its
                                                   small tables stacked in one file
        table=map_<name>/rank=<N>/<id>.parquet    a large one in its own (store/map_tables.py;
                                                   on the rank's clock)
        reports/<id>.json                          one per report: probe, identity, files, costs

Hive-partitioned (`table=`, `rank=`) so DuckDB, Spark, Dask, Arrow and pandas can read it
with partition pruning, e.g. `read_parquet('parts/table=kernels/*/*.parquet', hive_partitioning=true)`.
Why this shape:
- one file per (report, table): a rank is redone or replaced alone, and an engine reads a
  table without opening the others;
- `<id>` is the report's stem plus a hash of its absolute path, so two reports that claim
  the same rank never overwrite each other (the reduce marks one as duplicate);
- `rank=` is the rank known when the map ran (file name, else captured RANK/SLURM_PROCID),
  `-1` when only the reduce can assign one (file order); the `rank` column inside the file
  is the same number. The store (reduce) is authoritative for duplicates and file order;
- times are integer ns since the rank's own session start (no cross-rank base exists at
  map time); `reports/<id>.json` holds `probe.session_start_ns` (UTC epoch ns), so
  `start + session_start_ns` is absolute time. The reduce shifts onto the shared clock;
- a table whose source the export lacks, or that has no rows, has no file;
- column names and types are the store's, from the one registry (tables.py).
`reports/<id>.json` is written last (atomically): a part is complete iff its meta says so.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

from orchestrator.collect.extract import tables_for_missing_columns
from orchestrator.collect.gather import ReportFile
from orchestrator.collect.probe import ENV_ALLOW, Probe

# Bumped when the map's output changes meaning: older metas are redone, never misread.
MAP_VERSION = 17
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def report_id(origin: Path, stem: str) -> str:
    """Stable per report: readable stem + 10 hex of the absolute path (stems may repeat
    across folders, and may hold characters a path segment or hive parser dislikes)."""
    digest = hashlib.sha1(str(origin.resolve()).encode(errors="surrogateescape")).hexdigest()[:10]
    return f"{_UNSAFE.sub('_', stem)[:80]}-{digest}"


# A part being written, named by tmp_part; temps of killed maps match it (mapreduce cleans them).
PART_TMP = re.compile(r"\..*\.tmp-(?P<pid>[0-9]+)\.parquet")


def tmp_part(final: Path) -> Path:
    """Where the part `final` is written before it is renamed onto it: readers never see half a
    file, and two processes never write the same temp."""
    return final.with_name(f".{final.stem}.tmp-{os.getpid()}.parquet")


def meta_path(parts: Path, rid: str) -> Path:
    return parts / "reports" / f"{rid}.json"


def probe_to_json(p: Probe, keep_env: bool) -> dict[str, Any]:
    """The probe as JSON, as much as the reduce reads of it: of its tables only what
    missing_columns asks, and the captured environment cut to the allow-list unless
    --keep-env (parts live on a shared filesystem: no tokens copied there)."""
    d = asdict(p)
    d["path"] = str(p.path)
    d["tables"] = tables_for_missing_columns(p)
    d["env"] = {k: v for k, v in p.env.items() if keep_env or ENV_ALLOW.match(k)}
    d["command"] = list(p.command)
    return d


def probe_from_json(d: dict[str, Any]) -> Probe:
    d = dict(d)
    d["path"] = Path(d["path"])
    d["tables"] = {t: set(cols) for t, cols in d["tables"].items()}
    d["command"] = tuple(d["command"])
    return Probe(**d)


def report_to_json(r: ReportFile) -> dict[str, Any]:
    return {"origin": str(r.origin), "stem": r.stem, "rank": r.rank, "host": r.host, "pid": r.pid,
            "sqlite": str(r.sqlite) if r.sqlite else None, "error": r.error, "notes": list(r.notes)}


def report_from_json(d: dict[str, Any]) -> ReportFile:
    return ReportFile(origin=Path(d["origin"]), stem=d["stem"], rank=d["rank"], host=d["host"], pid=d["pid"],
                      sqlite=Path(d["sqlite"]) if d["sqlite"] else None, error=d["error"], notes=tuple(d["notes"]))


def read_meta(path: Path) -> dict[str, Any] | None:
    """A report's meta, or None when absent or unreadable (a killed writer: redo it)."""
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and d.get("map_version") == MAP_VERSION else None


def source_stamp(origin: Path) -> list[int]:
    st = origin.stat()
    return [st.st_mtime_ns, st.st_size]


def is_fresh(meta: dict[str, Any] | None, origin: Path, parts: Path, keep_env: bool, engine: str) -> bool:
    """Reuse a report's parts when they were made from this very file (same mtime and size,
    and the meta is newer than the report), with the same options, without error, and
    every file it lists is still there at the size it was written (a copy cut short is mapped
    again). Errors are always redone: the file may be fixed."""
    if meta is None or meta.get("error") or meta["probe"].get("error"):
        return False
    try:
        if meta["source"] != source_stamp(origin) or meta["written_ns"] < origin.stat().st_mtime_ns:
            return False
    except OSError:
        return False
    if meta["keep_env"] != keep_env or (engine != "auto" and meta["engine"] != engine):
        return False
    sizes = meta.get("sizes") or {}
    for f in part_files(meta):
        try:
            size = (parts / f).stat().st_size
        except OSError:
            return False
        if size != sizes.get(f, size):
            return False
    return True


def part_files(meta: dict[str, Any]) -> list[str]:
    """Every Parquet file a meta lists, relative to the parts folder: event tables, then the
    per-rank summaries (store/map_tables.py)."""
    return [*meta.get("files", {}).values(), *(meta.get("summaries") or {}).values()]
