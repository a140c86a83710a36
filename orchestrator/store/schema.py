"""The merged store's DDL, Arrow schemas, the removal of impossible rows and clock alignment,
all generated from the event-table registry (tables.py).

All times are integer ns on ONE clock: ns since the earliest session start among the
collected ranks (each report's `TARGET_INFO_SESSION_START_TIME.utcEpochNs` + its own
relative timestamps), plus `ranks.clock_correction_ns` when collective alignment is on.
Each rank's rows are contiguous in every event table (one insert per rank and table), so
DuckDB's zone maps on `rank` prune per-rank queries.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from importlib import resources

from orchestrator.store.tables import STORE_VERSION, TABLES

__all__ = [
    "EVENT_SCHEMA",
    "RANKS_DDL",
    "STORE_VERSION",
    "align_clocks_sql",
    "arrow_schema",
    "create_event_tables_sql",
    "finalize_sql",
    "negative_durations_sql",
]

_SQL_DIR = resources.files("orchestrator.store") / "sql"

# table -> [(column, duckdb type)], rank first.
EVENT_SCHEMA: dict[str, list[tuple[str, str]]] = {name: t.store_columns for name, t in TABLES.items()}

RANKS_DDL = """
CREATE TABLE ranks (
    rank INTEGER, host VARCHAR, pid BIGINT, local_rank INTEGER, node INTEGER,
    stage INTEGER, dp_index INTEGER, tp_index INTEGER, gpu_name VARCHAR,
    session_start_utc_ns BIGINT, clock_offset_ns BIGINT, clock_correction_ns BIGINT,
    nsys_version VARCHAR, schema_version VARCHAR, source_file VARCHAR,
    identity_source VARCHAR, status VARCHAR, error VARCHAR, untraced VARCHAR
);
CREATE TABLE sources (file VARCHAR, rank INTEGER, status VARCHAR, reason VARCHAR);
CREATE TABLE env (rank INTEGER, name VARCHAR, value VARCHAR);
CREATE TABLE meta (key VARCHAR, value VARCHAR);
"""


def create_event_tables_sql(skip: Iterable[str] = ()) -> str:
    """The empty event tables, created before the ingest so that its workers insert straight
    into the store (no staging copy): the columns and types are the registry's, whatever
    the inserted SELECTs produce. `skip`: tables that will be views (store/views.py)."""
    stmts = []
    for table, cols in EVENT_SCHEMA.items():
        if table in set(skip):
            continue
        body = ", ".join(f'"{c}" {t}' for c, t in cols)
        stmts.append(f"CREATE TABLE {table} ({body});")
    return "\n".join(stmts)


def arrow_schema(table: str):  # -> pyarrow.Schema
    import pyarrow as pa

    types = {"INTEGER": pa.int32(), "BIGINT": pa.int64(), "VARCHAR": pa.string()}
    return pa.schema([(c, types[t]) for c, t in EVENT_SCHEMA[table]])


def negative_durations_sql(source: Mapping[str, str | None] | None = None) -> str:
    """(rank, table, n) for rows that end before they start, in the store's event tables as
    the ingest left them (counted on their rank before `finalize_sql` deletes them); `source`
    names the relation that holds every row of a table where that is not the table itself,
    None for a table counted elsewhere (the maps counted it)."""
    source = source or {}
    parts = [f"SELECT rank, '{name}' AS tbl, count(*) AS n FROM {source.get(name, name)} "
             "WHERE \"end\" < start GROUP BY rank"
             for name, t in TABLES.items() if t.has_duration and source.get(name, name) is not None]
    if not parts:
        return "SELECT NULL::INTEGER AS rank, NULL::VARCHAR AS tbl, NULL::BIGINT AS n WHERE false"
    return " UNION ALL ".join(parts) + " ORDER BY rank, tbl"


def finalize_sql(impossible: Iterable[str] = ()) -> str:
    """Delete the rows that end before they start from the `impossible` tables (those where
    `negative_durations_sql` found some: the others are not scanned again), then the fixed
    part (finalize.sql). A NULL start or end is kept, as it always was."""
    stmts = [f'DELETE FROM {name} WHERE "end" < start;'
             for name, t in TABLES.items() if t.has_duration and name in set(impossible)]
    return "\n".join(stmts) + "\n" + (_SQL_DIR / "finalize.sql").read_text()


def align_clocks_sql(views: Iterable[str] = ()) -> str:
    """The per-rank correction (align_clocks.sql), applied to every shifted column; a table
    that is a view over the parts (`views`) takes it through its parts' offsets."""
    updates = ["UPDATE event_parts SET off = off + corr.ns FROM corr WHERE event_parts.rank = corr.rank;"
               ] if views else []
    for name, t in TABLES.items():
        if not t.shifted or name in set(views):
            continue
        sets = ", ".join(f'"{c}" = "{c}" + corr.ns' for c in t.shifted)
        updates.append(f"UPDATE {name} SET {sets} FROM corr WHERE {name}.rank = corr.rank;")
    return "\n".join([(_SQL_DIR / "align_clocks.sql").read_text(), *updates,
                      "UPDATE ranks SET clock_correction_ns = corr.ns FROM corr WHERE ranks.rank = corr.rank;",
                      "DROP TABLE corr;"])
