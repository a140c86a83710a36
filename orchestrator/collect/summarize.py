"""The map's per-rank statistics: the analysis SQL that needs one rank's events only, run in the
map task on that rank's fresh parts, written as small parts for the reduce (store/map_tables.py
says which tables, and when the analysis takes them).

The rank's parts become a one-rank store in memory through the reduce's own code (the same
identity, finalize and impossible-row deletion as in the job's store), under the memory limit
and with the task's threads; the analysis then runs only the files the summaries need (their
steps, window and scope included) with the default options, and the summaries are copied to
Parquet: the small ones stacked in one part, a large one in its own (map_tables.STACK).
Nothing here fails the map: a rank without summaries is computed by the analysis.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb

from orchestrator.collect.identity import Layout
from orchestrator.collect.parts import tmp_part
from orchestrator.collect.reduce import reduce_into
from orchestrator.duckdb_memory import limit
from orchestrator.metrics.engine import MAP_OPTIONS, analysis
from orchestrator.sqltext import quote, set_option
from orchestrator.store.map_tables import SQL_FILES, STACK, SUMMARIES, stacked_select
from orchestrator.store.partpaths import part_path


def summarize(meta: dict[str, Any], parts: Path, rank: int | None, rid: str, threads: int = 1,
              job: str | None = None) -> dict[str, str]:
    """Write the summaries of the report `meta` describes (its event parts under `parts`);
    returns {table: part file relative to `parts`} (a summary without rows has no file).
    `job`: how the job ended, kept in the one-rank store's meta as the job's store keeps it, so
    that a job stopped before its end has the step the rank was stopped in cut from its
    statistics, as the report cuts the first step some rank never finished (10_steps.sql,
    open_steps): where the rank was stopped in that step, the report takes its statistics from
    the map. None: a job still running (the map in the job), or reports alone."""
    con = duckdb.connect()
    written: list[Path] = []
    try:
        set_option(con, "threads", max(1, threads))
        limit(con)  # spills under the system temp directory (the task's node)
        con.execute("ATTACH ':memory:' AS store")
        con.execute("USE store")
        reduce_into(con, [meta], parts, layout=Layout(), extra_meta={"job": job} if job else None)
        con.execute("USE memory")
        cur, _ = analysis(Path("<map>"), MAP_OPTIONS, writer=con, only=SQL_FILES, threads=threads)
        files = {}
        for table, query in [(STACK, stacked_select()), *((s.table, s.select()) for s in SUMMARIES if s.own)]:
            final = part_path(parts, table, rank, rid)
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = tmp_part(final)
            written.append(tmp)
            n = cur.execute(f"COPY ({query}) TO '{quote(str(tmp))}' (FORMAT parquet)").fetchone()[0]
            if n:
                tmp.replace(final)
                files[table] = str(final.relative_to(parts))
                written.append(final)
            else:  # no rows, no file: neither the temp nor an older run's part
                tmp.unlink(missing_ok=True)
                final.unlink(missing_ok=True)
        written = []  # complete: keep them
        return files
    finally:
        con.close()
        for f in written:  # an interrupted summary leaves no file behind
            f.unlink(missing_ok=True)


def try_summarize(meta: dict[str, Any], parts: Path, rank: int | None, rid: str,
                  threads: int = 1, job: str | None = None) -> tuple[dict[str, str], str | None]:
    """`summarize`, or no summaries and the reason. Any failure (a trace the SQL does not
    expect included) only costs the analysis this rank's statistics, never the map."""
    try:
        return summarize(meta, parts, rank, rid, threads, job), None
    except Exception as e:  # any failure: see the docstring
        return {}, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
