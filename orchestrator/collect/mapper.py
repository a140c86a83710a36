"""The map step, one report at a time: export (if needed), probe, identify as far as one
report can tell, and write the store's columns as Parquet parts (layout in parts.py).

The same function runs in a local process pool (`orch collect --parts`), in every task of
a Slurm job array (`--on-cluster`) and in the job itself (jobmap.py): one code path. It reuses
the collect modules as they are (gather's export, probe, identity, extract.select_sql over the
registry), so a part holds exactly the rows the in-process ingest would insert for that rank,
before the shared clock.
Every failure is recorded in the report's meta, never raised past the report: one bad file
cannot stop a chunk (`map_chunk_strict` raises afterwards, so Slurm marks the task FAILED).
"""

from __future__ import annotations

import copy
import functools
import os
import re
import socket
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from orchestrator import numbers
from orchestrator.collect.extract import select_sql
from orchestrator.collect.gather import ReportFile, export_one, find_nsys
from orchestrator.collect.identity import identify
from orchestrator.collect.ingest import SCANNER_CONFIG, arrow_batches, first_line, load_scanner
from orchestrator.collect.parts import (
    MAP_VERSION,
    is_fresh,
    meta_path,
    part_files,
    probe_to_json,
    read_meta,
    report_id,
    report_to_json,
    source_stamp,
    tmp_part,
)
from orchestrator.collect.probe import Probe, open_ro, probe
from orchestrator.fsutil import write_json_atomic
from orchestrator.sqltext import attach, file_literal, quote, set_option
from orchestrator.store.partpaths import part_path
from orchestrator.store.schema import EVENT_SCHEMA, arrow_schema
from orchestrator.store.tables import TABLES

_INVALID_UNICODE = re.compile(r"[Ii]nvalid unicode|UTF-?8", re.IGNORECASE)
COMPRESSION = "zstd"  # smallest parts for the CPU it costs (docs/scale.md)


@dataclass
class MapTask:
    """One report to map; picklable (submitit ships it to the array task)."""

    report: ReportFile
    parts: Path
    exports: Path
    nsys: str | None = None
    engine: str = "auto"  # auto | scanner | sqlite3
    keep_env: bool = False
    threads: int = 1
    export_timeout_s: float = 3600
    summaries: bool = False  # the rank's per-rank statistics too (summarize.py)
    job: str | None = None  # how the job ended (JobEvidence.end_only), when it has (summarize.py)
    in_job: bool = False  # mapped by the job itself, on the rank's node (jobmap.py)

    @functools.cached_property
    def rid(self) -> str:
        """report_id, once: it resolves the path, and a collect of many reports asks often."""
        return report_id(self.report.origin, self.report.stem)

    @property
    def meta(self) -> Path:
        return meta_path(self.parts, self.rid)

    def fresh(self, meta: dict[str, Any] | None = None) -> bool:
        """`meta` (default: the one on disk) can be reused for this task: parts.is_fresh, and,
        when summaries are asked for, summaries made without error by today's SQL."""
        meta = read_meta(self.meta) if meta is None else meta
        if meta is None or not is_fresh(meta, self.report.origin, self.parts, self.keep_env, self.engine):
            return False
        if not self.summaries:
            return True
        from orchestrator.metrics.engine import map_sql  # the analysis engine only when asked for

        return (meta.get("summaries") is not None and not meta.get("summary_error")
                and meta.get("summary_sql") == map_sql())


def _map_rank(r: ReportFile, p: Probe) -> int | None:
    """The rank one report tells on its own (name, else captured env), without touching
    the originals' notes (the reduce identifies again across all reports)."""
    members, _ = identify([copy.deepcopy(r)], [copy.deepcopy(p)])
    m = members[0]
    return m.rank if m.source in ("file name", "captured env") else None


def _cast_cols(table: str) -> str:
    return ", ".join(f'CAST("{c}" AS {t}) AS "{c}"' for c, t in EVENT_SCHEMA[table])


_CON: duckdb.DuckDBPyConnection | None = None


def _scanner_con(threads: int) -> duckdb.DuckDBPyConnection:
    """One in-memory DuckDB per process with the scanner loaded, reused across reports:
    connecting and loading the extension cost more than extracting a small rank."""
    global _CON
    if _CON is None:
        con = duckdb.connect(config=SCANNER_CONFIG)
        if not load_scanner(con):
            con.close()
            raise RuntimeError("sqlite scanner unavailable")
        # Parts read back (the impossible-row count) would stay in DuckDB's file cache, growing
        # with every report a worker maps (1,024 ranks: 125 MB against 69 MB without it).
        con.execute("SET enable_external_file_cache = false")
        _CON = con
    set_option(_CON, "threads", max(1, threads))
    return _CON


def _targets(p: Probe, rank: int, tmp_of: dict[str, Path], prefix: str) -> Iterator[tuple[str, str, Path]]:
    """Each event table this export has: its SELECT (source tables under `prefix`) and the temp
    Parquet file it goes to (folder made). Both writers below walk the same list."""
    for table in EVENT_SCHEMA:
        sql = select_sql(table, p, rank, 0, prefix)
        if sql:
            out = tmp_of[table]
            out.parent.mkdir(parents=True, exist_ok=True)
            yield table, sql, out


def _write_scanner(task: MapTask, p: Probe, rank: int, tmp_of: dict[str, Path]) -> dict[str, int]:
    """DuckDB's sqlite scanner runs the registry's SELECT and writes Parquet directly."""
    con = _scanner_con(task.threads)
    path = str(Path(p.path).resolve())
    attach(con, path, "src", sqlite=True, read_only=True)
    try:
        rows = {}
        for table, sql, out in _targets(p, rank, tmp_of, "src."):
            n = con.execute(f"COPY (SELECT {_cast_cols(table)} FROM ({sql})) TO '{quote(str(out))}' "
                            f"(FORMAT parquet, COMPRESSION {COMPRESSION})").fetchone()[0]
            rows[table] = int(n)
        return rows
    finally:
        con.execute("DETACH DATABASE IF EXISTS src")


def _write_sqlite3(task: MapTask, p: Probe, rank: int, tmp_of: dict[str, Path], notes: list[str]) -> dict[str, int]:
    """Fallback without the extension, and for invalid UTF-8 (U+FFFD, noted): sqlite3 runs
    the same SELECTs, Arrow batches stream into a Parquet writer (never a whole table)."""
    import pyarrow.parquet as pq

    scon = open_ro(p.path)
    scon.text_factory = bad = numbers.CountingDecoder()
    rows = {}
    try:
        for table, sql, out in _targets(p, rank, tmp_of, ""):
            n = 0
            with pq.ParquetWriter(out, arrow_schema(table), compression=COMPRESSION) as w:
                for batch in arrow_batches(scon.execute(sql), table):
                    w.write_batch(batch)
                    n += batch.num_rows
            rows[table] = n
    finally:
        scon.close()
    if bad.bad:
        notes.append("invalid UTF-8 in trace strings replaced with U+FFFD")
    return rows


def _extract(task: MapTask, p: Probe, rank: int | None,
             rid: str) -> tuple[dict[str, str], dict[str, int], list[str], str]:
    """Parts of one report: (files by table, rows by table, notes, engine used)."""
    r = -1 if rank is None else rank
    final = {t: part_path(task.parts, t, rank, rid) for t in EVENT_SCHEMA}
    tmp_of = {t: tmp_part(f) for t, f in final.items()}
    notes: list[str] = []
    try:
        used = "sqlite3"
        rows: dict[str, int] | None = None
        if task.engine in ("auto", "scanner"):
            try:
                rows, used = _write_scanner(task, p, r, tmp_of), "scanner"
            except (duckdb.Error, RuntimeError) as e:
                # DuckDB refuses invalid UTF-8 (sqlite3 reads it as U+FFFD); `auto` also
                # falls back when the extension is missing, as the in-process ingest does.
                unavailable = isinstance(e, RuntimeError) and task.engine == "auto"
                if not (_INVALID_UNICODE.search(str(e)) or unavailable):
                    raise
        if rows is None:
            rows = _write_sqlite3(task, p, r, tmp_of, notes)
        files = {}
        for t, n in rows.items():
            if n:
                tmp_of[t].replace(final[t])
                files[t] = str(final[t].relative_to(task.parts))
        return files, {t: n for t, n in rows.items() if n}, notes, used
    finally:
        for f in tmp_of.values():
            f.unlink(missing_ok=True)


def _impossible(parts: Path, files: dict[str, str]) -> dict[str, int]:
    """This report's rows that end before they start, per table (those with any): the reduce
    takes these counts instead of reading every part's times again (views.py)."""
    tables = [t for t in files if TABLES[t].has_duration]
    if not tables:
        return {}
    sql = " UNION ALL ".join(f"SELECT '{t}', count(*) FROM read_parquet({file_literal(parts / files[t])}) "
                             'WHERE "end" < start' for t in tables)
    con = _CON or duckdb.connect()  # the process's scanner connection: connecting costs more than counting
    try:
        return {t: int(n) for t, n in con.execute(sql).fetchall() if n}
    finally:
        if con is not _CON:
            con.close()


def map_report(task: MapTask) -> dict[str, Any]:
    """Map one report; returns (and writes last) its meta. Fresh parts are reused as is."""
    old = read_meta(task.meta)
    if old is not None and task.fresh(old):
        return {**old, "reused": True}
    r = copy.copy(task.report)
    rid = task.rid
    t0 = time.perf_counter()
    stamp = source_stamp(r.origin)
    if r.sqlite is None:
        task.exports.mkdir(parents=True, exist_ok=True)
        export_one(r, task.exports, find_nsys(task.nsys), task.export_timeout_s)
    t1 = time.perf_counter()
    p = probe(r.sqlite) if r.sqlite else Probe(path=r.origin, error=r.error or "no export")
    rank = _map_rank(r, p) if not p.error else None
    files: dict[str, str] = {}
    rows: dict[str, int] = {}
    notes: list[str] = []
    error = None
    used = None
    t2 = time.perf_counter()
    if not p.error:
        try:
            files, rows, notes, used = _extract(task, p, rank, rid)
        except (duckdb.Error, sqlite3.Error, ValueError, OSError, RuntimeError) as e:
            error = f"ingest failed: {first_line(e)}"
    try:
        counts = {"impossible": _impossible(task.parts, files)} if not error else {}
    except (duckdb.Error, OSError):
        counts = {}  # not a failure of the rank: the reduce counts them from the parts
    t3 = time.perf_counter()
    meta = {
        "map_version": MAP_VERSION, "id": rid, "report": report_to_json(r),
        "probe": probe_to_json(p, task.keep_env), "map_rank": rank, "files": files, "rows": rows,
        **counts, "notes": notes, "error": error, "engine": used, "keep_env": task.keep_env,
        "source": stamp,
    }
    summaries: dict[str, str] | None = None
    meta["summary_error"] = meta["summary_sql"] = None
    if task.summaries and not error:
        from orchestrator.collect.summarize import try_summarize  # loads the analysis: only when asked
        from orchestrator.metrics.engine import map_sql

        summaries, meta["summary_error"] = (try_summarize(meta, task.parts, rank, rid, task.threads, task.job)
                                            if files else ({}, None))
        meta["summary_sql"] = map_sql()
    t4 = time.perf_counter()
    for f in part_files(old or {}):  # parts of an earlier map at another rank
        if f not in files.values() and f not in (summaries or {}).values():
            (task.parts / f).unlink(missing_ok=True)
    sizes = {f: (task.parts / f).stat().st_size for f in [*files.values(), *(summaries or {}).values()]}
    meta.update({
        "summaries": summaries,
        "export_bytes": r.sqlite.stat().st_size if r.sqlite and r.sqlite.exists() else None,
        "part_bytes": sum(sizes[f] for f in files.values()),
        "sizes": sizes,
        "seconds": {"export": round(t1 - t0, 4), "probe": round(t2 - t1, 4), "extract": round(t3 - t2, 4),
                    "summarize": round(t4 - t3, 4)},
        "host": socket.gethostname(), "slurm_task": os.environ.get("SLURM_ARRAY_TASK_ID"), "in_job": task.in_job,
        "written_ns": time.time_ns(),
    })
    task.meta.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(task.meta, meta)
    return {**meta, "reused": False}


def summary(meta: dict[str, Any]) -> dict[str, Any]:
    """What a task sends back (small: the full meta is on disk)."""
    return {"id": meta["id"], "origin": meta["report"]["origin"], "reused": meta["reused"],
            "error": meta["error"] or meta["probe"]["error"], "host": meta["host"]}


def map_chunk(tasks: list[MapTask]) -> list[dict[str, Any]]:
    """Map several reports in one process (one array task, or one pool job)."""
    return [summary(map_report(t)) for t in tasks]


class MapFailed(RuntimeError):
    """Raised at the end of an array task whose chunk had failed reports (the others in the
    chunk are mapped): Slurm records the task FAILED and its log names the reports."""


def map_chunk_strict(tasks: list[MapTask]) -> list[dict[str, Any]]:
    out = map_chunk(tasks)
    bad = [s for s in out if s["error"]]
    if bad:
        raise MapFailed("; ".join(f"{Path(s['origin']).name}: {s['error']}" for s in bad))
    return out
