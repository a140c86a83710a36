"""The reduce step: every rank's Parquet parts -> one DuckDB store, in bounded memory.

Python holds one small record per report (its meta), never event rows. The store's
`event_parts` lists each table's part files with their report's final rank and clock offset;
DuckDB reads the parts with `read_parquet`, joined on the reader's `file_index`, and either
inserts them into the store's event tables (created as the in-process ingest creates them)
under `memory_limit`, spilling to `temp_directory` past it, or, for a table whose files are
large, leaves them there behind a view (views.py). The result is the in-process ingest's
store: the same identity (`identify` across all reports), the same finalize
(finalize.finalize_store: ranks, env, sources, impossible rows counted and left out) and the
same meta, so `orch report` gives the same answer either way (tests/test_parts.py compares
them table by table).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb

from orchestrator.collect.extract import insert_sql, missing_columns
from orchestrator.collect.finalize import finalize_store
from orchestrator.collect.identity import Layout, Member, identify
from orchestrator.collect.parts import probe_from_json, report_from_json
from orchestrator.collect.store import append_rows, new_store, write_meta
from orchestrator.duckdb_memory import limit
from orchestrator.metrics.engine import map_sql
from orchestrator.sqltext import execute, set_option
from orchestrator.store.map_tables import STACK, SUMMARIES, Summary, stack_columns
from orchestrator.store.schema import EVENT_SCHEMA, RANKS_DDL, align_clocks_sql, create_event_tables_sql
from orchestrator.store.tables import TABLES
from orchestrator.store.views import (
    EVENT_PARTS_DDL,
    VIEW_MIN_ROWS,
    choose,
    create_views,
    parts_select,
    unfiltered,
    view_sql,
)
from orchestrator.timings import phase


def members_from_metas(metas: list[dict[str, Any]]) -> tuple[list[Member], list[str]]:
    """Identify across every report (duplicates, file order), as the in-process path does."""
    reports = [report_from_json(m["report"]) for m in metas]
    probes = [probe_from_json(m["probe"]) for m in metas]
    return identify(reports, probes)


def _size(path: Path) -> int | None:
    """A part's size, which a reader checks the parts by (views.relocate); None if it is gone
    (then reading it says so)."""
    try:
        return path.stat().st_size
    except OSError:
        return None


def _insert_summaries(con: duckdb.DuckDBPyConnection, root: Path, files: dict[str, list[str]], *, own: bool,
                      viewed: Iterable[str] = ()) -> str | None:
    """The map's per-rank statistics, on each rank's own clock (store/map_tables.py): the
    small tables, or (`own`) the large ones, of which those `viewed` stay in the parts
    (views.OWN_MAPPED, made with the event tables' views). The small ones are stored as the
    maps wrote them, stacked in one table (STACK, ordered by table: a table's read skips, by
    their zone maps, the row groups that hold none of its rows), each behind a view of its
    declared columns: one table costs the reduce's commit and checkpoint less than thirty small
    ones (docs/history/benchmarks-after-job.md). They only spare the analysis work: a part that cannot
    be read leaves them all out (and says why)."""
    skip = set(viewed)
    tables = [s for s in SUMMARIES if s.own == own and s.table not in skip]
    con.execute("BEGIN")
    try:
        if own:
            for s in tables:
                con.execute(s.ddl())
                rows = parts_select(s.table, s.columns, (), root, files.get(s.table, []))
                con.execute(f"INSERT INTO {s.table} {rows}")
        else:
            _stack(con, parts_select(STACK, stack_columns(), (), root, files.get(STACK, [])), tables)
    except duckdb.Error as e:
        con.execute("ROLLBACK")
        for s in SUMMARIES:
            if s.table not in skip and s.own:
                con.execute(s.ddl())
                con.execute(f"DELETE FROM {s.table}")
        _stack(con, parts_select(STACK, stack_columns(), (), root, []), [s for s in SUMMARIES if not s.own])
        return f"not used ({str(e).splitlines()[0]})"
    # Outside the try: a part that cannot be read is what the fallback is for; a store that
    # cannot be written (a full disk) fails the reduce, and DuckDB has already ended the
    # transaction, so a ROLLBACK there would only hide that error behind its own.
    con.execute("COMMIT")
    return None


def _stack(con: duckdb.DuckDBPyConnection, rows: str, tables: list[Summary]) -> None:
    """The stacked table from the query `rows`, and the views of `tables` over it."""
    con.execute(f"CREATE OR REPLACE TABLE {STACK} AS SELECT * FROM ({rows}) ORDER BY tbl")
    for s in tables:
        con.execute(f"CREATE OR REPLACE VIEW {s.table} AS {s.unstacked(STACK)}")


def _mapped_by_this_sql(con: duckdb.DuckDBPyConnection, ranks: list[int]) -> bool:
    """Whether every one of `ranks` has map statistics made by this orch's analysis SQL, as the
    analysis will check them (05_mapped.sql): only then does it leave every rank's CUDA calls
    unread (and, with the map's options, its copies, memsets and OS-runtime calls), and may they
    stay in the parts (views.IF_MAPPED)."""
    if not ranks:
        return False
    n = execute(con, "SELECT count(DISTINCT rank) FROM map_scope WHERE split_part(sql, ' ', 1) = ? "
                "AND list_contains(?, rank)", [map_sql(), ranks]).fetchone()[0]
    return n == len(set(ranks))


def build_store_from_parts(
    metas: list[dict[str, Any]], parts: Path, store: Path, *, layout: Layout, keep_env: bool = False,
    align: bool = False, expected: list[int] | None = None, extra_meta: dict[str, object] | None = None,
    threads: int = 2, members: list[Member] | None = None, views: Iterable[str] = (),
    view_min_rows: int = VIEW_MIN_ROWS,
) -> list[str]:
    """Write `store` atomically from the parts that `metas` list; returns the tables it reads
    from the parts. `members` (from members_from_metas, in metas' order) may be passed when
    the caller already identified them (and completed the layout); `views`: event tables the
    store may read from the parts instead of holding a copy, those whose files hold
    `view_min_rows` rows on average (views.choose)."""
    with new_store(store) as tmp:
        con = duckdb.connect(str(tmp))
        try:
            set_option(con, "threads", max(1, threads))
            limit(con, str(store.parent / ".duckdb-spill"))
            viewed = reduce_into(con, metas, parts, layout=layout, keep_env=keep_env, align=align,
                                 expected=expected, extra_meta=extra_meta, members=members, views=views,
                                 view_min_rows=view_min_rows, store=store)
            with phase("reduce: checkpoint"):
                con.execute("CHECKPOINT")
        finally:
            con.close()
    return viewed


def reduce_into(
    con: duckdb.DuckDBPyConnection, metas: list[dict[str, Any]], parts: Path, *, layout: Layout,
    keep_env: bool = False, align: bool = False, expected: list[int] | None = None,
    extra_meta: dict[str, object] | None = None, members: list[Member] | None = None,
    views: Iterable[str] = (), view_min_rows: int = VIEW_MIN_ROWS, store: Path | None = None,
) -> list[str]:
    """The store's tables from the parts, in `con`'s current database (a file, or the map's
    one-rank store in memory: collect/summarize.py); those of the `views` that views.choose
    keeps stay in the parts, read through views that `store`'s meta locates (returned)."""
    if members is None:
        members, _ = members_from_metas(metas)
    ok = [(m, meta) for m, meta in zip(members, metas, strict=True)
          if m.status == "ok" and not m.probe.error and m.report.sqlite]
    starts = [m.probe.session_start_ns for m, _ in ok if m.probe.session_start_ns is not None]
    base = min(starts) if starts else 0
    root = parts.resolve()
    files: dict[str, list[str]] = {t: [] for t in EVENT_SCHEMA}
    index: list[tuple[str, int, str, int, int, int]] = []
    rows: dict[str, int] = {}
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
        for t, n in (meta.get("rows") or {}).items():
            rows[t] = rows.get(t, 0) + n
        for table, rel in [*meta["files"].items(), *(meta.get("summaries") or {}).items()]:
            listed = files.setdefault(table, [])
            index.append((table, len(listed), rel, m.rank, off, _size(root / rel)))  # type: ignore[arg-type]
            listed.append(rel)
    con.execute(RANKS_DDL)
    con.execute(EVENT_PARTS_DDL)
    append_rows(con, "event_parts", ("tbl", "i", "path", "rank", "off", "bytes"), index)
    with phase("reduce: map statistics"):
        stats = _insert_summaries(con, root, files, own=False)
    mapped = stats is None and _mapped_by_this_sql(con, [m.rank for m, meta in ok if not meta["error"]])
    viewed = choose(views, rows, {t: len(f) for t, f in files.items()}, view_min_rows, mapped=mapped)
    with phase("reduce: map islands"):
        stats = stats or _insert_summaries(con, root, files, own=True, viewed=viewed)
    events = [t for t in viewed if t in TABLES]  # (the map's own tables have no impossible rows)
    con.execute(create_event_tables_sql(skip=events))
    # The maps count the impossible rows of their report (mapper._impossible); parts mapped by
    # an orch that did not are read again, through the views' unfiltered twins.
    counted = all("impossible" in meta for _, meta in ok if not meta["error"])
    known = [(m.rank, t, n) for m, meta in ok for t, n in meta.get("impossible", {}).items() if t in events]
    if not counted:
        for table in events:
            con.execute(view_sql(table, root, files[table], name=unfiltered(table), temp=True))
    for table, cols in EVENT_SCHEMA.items():
        if table not in events:
            with phase(f"reduce: copy {table}"):
                con.execute(insert_sql(table, table, parts_select(table, cols, TABLES[table].shifted, root,
                                                                  files[table])))
    impossible = finalize_store(con, members, base, layout, keep_env, expected,
                                unfiltered={t: None if counted else unfiltered(t) for t in events},
                                known=known if counted else [])
    filtered = [t for t in events if t in impossible]
    create_views(con, root, viewed, filtered)
    if align:
        con.execute(align_clocks_sql(events))
    where = {"event_views": ",".join(viewed), "event_views_filtered": ",".join(filtered),
             "event_view_rows": sum(rows.get(t, 0) for t in viewed),
             "parts_from_store": os.path.relpath(root, store.resolve().parent)} if viewed and store else {}
    write_meta(con, engine="parts", base=base, layout=layout, align=align,
               extra={"parts": str(root), **where, **({"map_stats": stats} if stats else {}), **(extra_meta or {})})
    return viewed
