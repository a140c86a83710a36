"""The reduce step: every rank's Parquet parts -> one DuckDB store, in bounded memory.

Python holds one small record per report (its meta), never event rows: DuckDB reads the
parts with `read_parquet`, shifts each rank onto the shared clock through a tiny
(file -> rank, offset) table, and inserts them into the store's event tables (created as the
in-process ingest creates them) under `memory_limit`, spilling to `temp_directory` past it.
The result is the in-process ingest's store: the same identity (`identify` across all
reports), the same finalize (finalize.finalize_store: ranks, env, sources, impossible rows counted
and deleted, finalize.sql) and the same meta, so `orch report` gives the same answer either
way (tests/test_parts.py compares them table by table).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import duckdb

from orchestrator.analyze.summaries import SUMMARIES
from orchestrator.collect.extract import insert_sql, missing_columns
from orchestrator.collect.finalize import finalize_store
from orchestrator.collect.identity import Layout, Member, identify
from orchestrator.collect.parts import probe_from_json, report_from_json
from orchestrator.collect.schema import EVENT_SCHEMA, RANKS_DDL, align_clocks_sql, create_event_tables_sql
from orchestrator.collect.store import append_rows, new_store, write_meta
from orchestrator.collect.tables import TABLES
from orchestrator.memory import limit
from orchestrator.sqltext import quote


def members_from_metas(metas: list[dict[str, Any]]) -> tuple[list[Member], list[str]]:
    """Identify across every report (duplicates, file order), as the in-process path does."""
    reports = [report_from_json(m["report"]) for m in metas]
    probes = [probe_from_json(m["probe"]) for m in metas]
    return identify(reports, probes)


def _parts_select(columns: Sequence[tuple[str, str]], shifted: set[str], files: list[str]) -> str:
    """The rows of `files` (parts of one table) with the final rank from `part_map`, the
    `shifted` columns moved onto the shared clock."""
    if not files:
        return "SELECT " + ", ".join(f'CAST(NULL AS {t}) AS "{c}"' for c, t in columns) + " WHERE false"
    cols = ["m.rank AS rank" if c == "rank" else f'p."{c}" + m.off AS "{c}"' if c in shifted else f'p."{c}"'
            for c, _ in columns]
    listing = ", ".join(f"'{quote(f)}'" for f in files)
    return (f"SELECT {', '.join(cols)} FROM read_parquet([{listing}], filename = true, hive_partitioning = false) p "
            "JOIN part_map m ON m.file = p.filename")


def _stage_view(table: str, files: list[str]) -> str:
    """`{table}_stage`: the parts of one table on the shared clock, with the final rank."""
    return f"CREATE TEMP VIEW {table}_stage AS " + _parts_select(EVENT_SCHEMA[table], set(TABLES[table].shifted), files)


def _insert_summaries(con: duckdb.DuckDBPyConnection, files: dict[str, list[str]]) -> str | None:
    """The map's per-rank statistics, on each rank's own clock (analyze/summaries.py). They only
    spare the analysis work: a part that cannot be read leaves them all out (and says why)."""
    for s in SUMMARIES:
        con.execute(s.ddl())
    try:
        for s in SUMMARIES:
            con.execute(f"INSERT INTO {s.table} " + _parts_select(s.columns, set(), files.get(s.table, [])))
    except duckdb.Error as e:
        for s in SUMMARIES:
            con.execute(f"DELETE FROM {s.table}")
        return f"not used ({str(e).splitlines()[0]})"
    return None


def build_store_from_parts(
    metas: list[dict[str, Any]], parts: Path, store: Path, *, layout: Layout, keep_env: bool = False,
    align: bool = False, expected: list[int] | None = None, extra_meta: dict[str, object] | None = None,
    threads: int = 2, members: list[Member] | None = None,
) -> str:
    """Write `store` atomically from the parts that `metas` list; returns the engine label.
    `members` (from members_from_metas, in metas' order) may be passed when the caller
    already identified them (and completed the layout)."""
    with new_store(store) as tmp:
        con = duckdb.connect(str(tmp))
        try:
            con.execute(f"SET threads = {max(1, threads)}")
            limit(con, str(store.parent / ".duckdb-spill"))
            reduce_into(con, metas, parts, layout=layout, keep_env=keep_env, align=align, expected=expected,
                        extra_meta=extra_meta, members=members)
            con.execute("CHECKPOINT")
        finally:
            con.close()
    return "parts"


def reduce_into(
    con: duckdb.DuckDBPyConnection, metas: list[dict[str, Any]], parts: Path, *, layout: Layout,
    keep_env: bool = False, align: bool = False, expected: list[int] | None = None,
    extra_meta: dict[str, object] | None = None, members: list[Member] | None = None,
) -> None:
    """The store's tables from the parts, in `con`'s current database (a file, or the map's
    one-rank store in memory: collect/summarize.py)."""
    if members is None:
        members, _ = members_from_metas(metas)
    ok = [(m, meta) for m, meta in zip(members, metas, strict=True)
          if m.status == "ok" and not m.probe.error and m.report.sqlite]
    starts = [m.probe.session_start_ns for m, _ in ok if m.probe.session_start_ns is not None]
    base = min(starts) if starts else 0
    part_map: list[tuple[str, int, int]] = []
    files: dict[str, list[str]] = {t: [] for t in EVENT_SCHEMA}
    for m, meta in ok:
        # The order of notes is the in-process ingest's: missing columns, then what the
        # extraction found (invalid UTF-8), then its failure.
        gone = missing_columns(m.probe)
        if gone:
            m.probe.notes.append(f"missing columns (stored as NULL): {', '.join(gone)}")
        m.probe.notes.extend(meta["notes"])
        if meta["error"]:
            m.status = "error"
            m.notes.append(meta["error"])
            continue
        off = m.probe.session_start_ns - base  # type: ignore[operator]
        for table, rel in [*meta["files"].items(), *(meta.get("summaries") or {}).items()]:
            path = str((parts / rel).resolve())
            files.setdefault(table, []).append(path)
            part_map.append((path, m.rank, off))  # type: ignore[arg-type]
    con.execute(RANKS_DDL)
    con.execute(create_event_tables_sql())
    con.execute("CREATE TEMP TABLE part_map (file VARCHAR, rank INTEGER, off BIGINT)")
    append_rows(con, "part_map", ("file", "rank", "off"), part_map)
    for table, cols in EVENT_SCHEMA.items():
        con.execute(_stage_view(table, files[table]))
        names = ", ".join(f'"{c}"' for c, _ in cols)
        con.execute(insert_sql(table, table, f"SELECT {names} FROM {table}_stage"))
        con.execute(f"DROP VIEW {table}_stage")
    stats = _insert_summaries(con, files)
    con.execute("DROP TABLE part_map")
    finalize_store(con, members, base, layout, keep_env, expected)
    if align:
        con.execute(align_clocks_sql())
    write_meta(con, engine="parts", base=base, layout=layout, align=align,
               extra={"parts": str(parts.resolve()), **({"map_stats": stats} if stats else {}), **(extra_meta or {})})
