"""The event views the analysis reads no row of, left unbound while it runs.

Where every rank's map ran this analysis SQL in the report's scope, the analysis takes each
rank's statistics from the map and reads the event tables only for the ranks no map covered:
every read of them is joined to one of the gates below (the per-rank files read them through
views of the ranks they map: rankpass.py), which then hold no rank. On the parts
route those tables are views over one Parquet file per rank, and DuckDB binds such a view at
every statement that names it, checking and parsing every file's path however few rows the
gate lets through: a cost per statement that grows with the ranks, for reads that return
nothing (docs/history/benchmarks-after-job.md). So where the store says every rank was mapped, the
analysis runs over empty views of the same columns in their place; afterwards the gates say
whether a rank needed its events after all (another scope than its map's): then the real
views come back and the analysis runs again. The real views are back before anything else
reads the connection (the HTML's timeline draws a few ranks' events).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import duckdb

from orchestrator.sqltext import execute

# The event tables the analysis reads only through a gate (tests/test_unread.py).
GATED = ("cuda_api", "kernels", "memcpy", "memset", "osrt", "threads")

# Every rank whose events some statement still needs: the ranks no map ran this SQL for
# (05_mapped.sql), whose GPU ops are not the map's (14_gpu_ops.sql), whose statistics' scope
# is not the map's (21_stats_scope.sql; the stats scopes' ranks are among these), and those
# left without steps, whose steps the inferred-steps file infers from their CUDA calls
# (12_inferred_steps.sql: over empty views it infers none, so they stay without). A rank
# without a report (missing, or one that could not be read) has no events to need.
_GATES = """
SELECT rank FROM (
    SELECT rank FROM map_none UNION SELECT rank FROM ops_todo UNION SELECT rank FROM map_todo
    UNION (SELECT rank FROM cuda_calls EXCEPT SELECT rank FROM steps))
WHERE rank IN (SELECT rank FROM ranks WHERE status IN ('ok', 'partial'))"""

# Every rank mapped by this SQL, each with steps from its NVTX ranges: a rank without them has
# its steps inferred from its CUDA calls again (12_inferred_steps.sql: family 5), and a run that
# would open a gate anyway is not worth running twice.
_ALL_MAPPED = """
SELECT count(*) = 0 FROM ranks
WHERE status IN ('ok', 'partial')
  AND (rank NOT IN (SELECT rank FROM map_scope WHERE split_part(sql, ' ', 1) = ?)
       OR rank NOT IN (SELECT rank FROM map_steps WHERE family <> 5))"""

# A job that ended early has the first step some rank never finished cut from every rank
# (10_steps.sql, open_steps), and each map the step its own rank was stopped in
# (collect/summarize.py): their scopes agree where every rank was stopped in the same step, the
# maps' last steps alike.
_ONE_LAST_STEP = "SELECT count(DISTINCT top) = 1 FROM (SELECT max(step) AS top FROM map_steps GROUP BY rank)"


@dataclass(frozen=True)
class Left:
    """Views replaced by empty ones: each table with the view of the analysis's own catalog it
    replaced (the store's, moved with the run: collect/views.relocate), or None."""

    replaced: dict[str, str | None]

    def restore(self, con: duckdb.DuckDBPyConnection) -> None:
        """The real views again."""
        for table, sql in self.replaced.items():
            con.execute(f"DROP VIEW memory.main.{table}")
            if sql is not None:
                con.execute(sql)


def candidates(con: duckdb.DuckDBPyConnection) -> list[str]:
    """The GATED tables the store reads from its parts, where the analysis about to run (its
    `params` made) will most likely need none of their rows: every rank has the map's
    statistics with steps, and, where the job ended early, every map cut the same step; else
    none. (The caller checks that the options deciding a rank's scope are the map's.)"""
    try:
        viewed = execute(con, "SELECT value FROM meta WHERE key = 'event_views'").fetchall()
    except duckdb.CatalogException:  # not an orch store: the analysis says so
        return []
    tables = [t for t in GATED if viewed and t in viewed[0][0].split(",")]
    if not tables:
        return []
    map_sql, early = execute(con, "SELECT map_sql, ended_early FROM params").fetchone()
    if not execute(con, _ALL_MAPPED, [map_sql]).fetchone()[0]:
        return []
    if early and not con.execute(_ONE_LAST_STEP).fetchone()[0]:
        return []
    return tables


def leave_unread(con: duckdb.DuckDBPyConnection, tables: Sequence[str]) -> Left:
    """Empty views of `tables`' columns in the analysis's own catalog, which the search path
    reads first (engine.session)."""
    replaced: dict[str, str | None] = {}
    for table in tables:
        own = execute(con, "SELECT sql FROM duckdb_views() WHERE database_name = 'memory' "
                      "AND schema_name = 'main' AND view_name = ?", [table]).fetchall()
        cols = execute(con, "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ? AND "
                       "database_name = ? ORDER BY column_index", [table, "memory" if own else "store"]).fetchall()
        body = ", ".join(f'CAST(NULL AS {t}) AS "{c}"' for c, t in cols)
        replaced[table] = own[0][0] if own else None
        con.execute(f"CREATE OR REPLACE VIEW memory.main.{table} AS SELECT {body} WHERE false")
    return Left(replaced)


def needed(con: duckdb.DuckDBPyConnection) -> list[int]:
    """After an analysis over empty views: the ranks that needed their events (none: it stands)."""
    return [r for r, in con.execute(_GATES + " ORDER BY rank").fetchall()]
