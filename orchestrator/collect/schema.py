"""The merged store's tables: one definition feeds the DDL, the Arrow fallback and the docs.

All times are integer ns on ONE clock: ns since the earliest session start among the
collected ranks (each report's `TARGET_INFO_SESSION_START_TIME.utcEpochNs` + its own
relative timestamps), plus `ranks.clock_correction_ns` when collective alignment is on.
Each rank's rows are contiguous in every event table (one insert per rank and table), so
DuckDB's zone maps on `rank` prune per-rank queries.
"""

from __future__ import annotations

STORE_VERSION = 1

# table -> [(column, duckdb type)]
EVENT_SCHEMA: dict[str, list[tuple[str, str]]] = {
    "kernels": [
        ("rank", "INTEGER"), ("start", "BIGINT"), ("end", "BIGINT"), ("device", "INTEGER"),
        ("stream", "BIGINT"), ("correlation_id", "BIGINT"), ("short_name", "VARCHAR"),
        ("name", "VARCHAR"), ("category", "VARCHAR"),
    ],
    "memcpy": [
        ("rank", "INTEGER"), ("start", "BIGINT"), ("end", "BIGINT"), ("device", "INTEGER"),
        ("stream", "BIGINT"), ("correlation_id", "BIGINT"), ("kind", "VARCHAR"),
        ("bytes", "BIGINT"), ("src_kind", "VARCHAR"), ("dst_kind", "VARCHAR"),
    ],
    "memset": [
        ("rank", "INTEGER"), ("start", "BIGINT"), ("end", "BIGINT"), ("device", "INTEGER"),
        ("stream", "BIGINT"), ("correlation_id", "BIGINT"), ("bytes", "BIGINT"),
    ],
    "cuda_api": [
        ("rank", "INTEGER"), ("start", "BIGINT"), ("end", "BIGINT"), ("tid", "BIGINT"),
        ("correlation_id", "BIGINT"), ("name", "VARCHAR"),
    ],
    "nvtx": [
        ("rank", "INTEGER"), ("start", "BIGINT"), ("end", "BIGINT"), ("tid", "BIGINT"),
        ("domain_id", "BIGINT"), ("domain", "VARCHAR"), ("text", "VARCHAR"), ("depth", "INTEGER"),
    ],
    "gpu_metrics": [
        ("rank", "INTEGER"), ("start", "BIGINT"), ("gpu", "INTEGER"), ("metric", "VARCHAR"),
        ("value", "BIGINT"),
    ],
}

RANKS_DDL = """
CREATE TABLE ranks (
    rank INTEGER, host VARCHAR, pid BIGINT, local_rank INTEGER, node INTEGER,
    stage INTEGER, dp_index INTEGER, tp_index INTEGER, gpu_name VARCHAR,
    session_start_utc_ns BIGINT, clock_offset_ns BIGINT, clock_correction_ns BIGINT,
    nsys_version VARCHAR, schema_version VARCHAR, source_file VARCHAR,
    identity_source VARCHAR, status VARCHAR, error VARCHAR
);
CREATE TABLE sources (file VARCHAR, rank INTEGER, status VARCHAR, reason VARCHAR);
CREATE TABLE env (rank INTEGER, name VARCHAR, value VARCHAR);
CREATE TABLE meta (key VARCHAR, value VARCHAR);
"""


def create_event_tables_sql(suffix: str = "", prefix: str = "") -> str:
    stmts = []
    for table, cols in EVENT_SCHEMA.items():
        body = ", ".join(f'"{c}" {t}' for c, t in cols)
        stmts.append(f"CREATE TABLE {prefix}{table}{suffix} ({body});")
    return "\n".join(stmts)


def arrow_schema(table: str):  # -> pyarrow.Schema
    import pyarrow as pa

    types = {"INTEGER": pa.int32(), "BIGINT": pa.int64(), "VARCHAR": pa.string()}
    return pa.schema([(c, types[t]) for c, t in EVENT_SCHEMA[table]])
