"""The map's per-rank statistics: the analysis SQL that needs one rank's events only, run in the
map task on that rank's fresh parts, written as small parts for the reduce (analyze/summaries.py
says which tables, and when the analysis takes them).

The rank's parts become a one-rank store in memory through the reduce's own code (the same
identity, finalize and impossible-row deletion as in the job's store); the analysis then runs
only the files the summaries need (their steps, window and scope included) with the default
options, and each summary is copied to Parquet. Nothing here can fail
the map: a rank without summaries is computed by the analysis, as every rank was before.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import duckdb

from orchestrator.analyze.engine import Options, analysis
from orchestrator.analyze.summaries import SQL_FILES, SUMMARIES
from orchestrator.collect.identity import Layout
from orchestrator.collect.parts import part_path
from orchestrator.collect.reduce import reduce_into
from orchestrator.errors import OrchError
from orchestrator.sqltext import quote


def summarize(meta: dict[str, Any], parts: Path, rank: int | None, rid: str) -> dict[str, str]:
    """Write the summaries of the report `meta` describes (its event parts under `parts`);
    returns {table: part file relative to `parts`} (a summary without rows has no file)."""
    con = duckdb.connect()
    try:
        con.execute("SET threads = 1")
        con.execute("ATTACH ':memory:' AS store")
        con.execute("USE store")
        reduce_into(con, [meta], parts, layout=Layout())
        con.execute("USE memory")
        cur, _ = analysis(Path("<map>"), Options(), writer=con, only=SQL_FILES)
        files = {}
        for s in SUMMARIES:
            final = part_path(parts, s.table, rank, rid)
            final.parent.mkdir(parents=True, exist_ok=True)
            tmp = final.with_name(f".{final.stem}.tmp-{os.getpid()}.parquet")
            n = cur.execute(f"COPY ({s.select()}) TO '{quote(str(tmp))}' (FORMAT parquet)").fetchone()[0]
            if n:
                tmp.replace(final)
                files[s.table] = str(final.relative_to(parts))
            else:
                tmp.unlink(missing_ok=True)
                final.unlink(missing_ok=True)
        return files
    finally:
        con.close()


def try_summarize(meta: dict[str, Any], parts: Path, rank: int | None, rid: str) -> tuple[dict[str, str], str | None]:
    """`summarize`, or no summaries and the reason: the analysis then computes this rank."""
    try:
        return summarize(meta, parts, rank, rid), None
    except (duckdb.Error, OrchError, OSError) as e:
        return {}, str(e).splitlines()[0] if str(e) else type(e).__name__
