"""The analysis's per-rank pass: the map's own SQL, run in the report over the ranks whose map
it cannot take (map_todo, 21_stats_scope.sql: no map, another scope, another SQL).

A `-- Map: per rank` file (sqlmodules.py) computes what needs one rank's rows alone. The map
runs it on its one-rank store; the analysis runs the same statements once over every rank it
maps itself, where each name the files read from before the pass is a view of that name's rows
of those ranks only (schema INPUTS, first on the files' search path) and what the files create
goes to schema PASS. Each table the map writes is then taken, under its own name, as the
pass's rows and the map's rows of the other ranks (map_ranks), their times moved onto the
store's clock (store/map_tables.py: `Summary.taken`). So one statement computes each per-rank
table, over the ranks the analysis maps, and no file writes the other ranks' half. The files
after the pass read the taken tables first, then the pass's own helpers (the search path of
`engine.session`). A view binds its names where it is read: a per-rank file's views read only
the pass's own tables (tests/test_sql_modules.py), never an input, which a reader after the
pass would see whole.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import duckdb

from orchestrator import sqlmodules
from orchestrator.metrics.sqlrun import Unit, plan_modules
from orchestrator.store.map_tables import SUMMARIES, Summary

PASS = "rank_pass"
INPUTS = "rank_inputs"
# What the per-rank files resolve names in: their own tables, the ranks' inputs, then the rest.
PATH = f"memory.{PASS},memory.{INPUTS},memory.main,store.main"
# Read by rowid (17_cpu_ranges.sql keys the ranges by it), which a view has not: read whole,
# its rows narrowed by the rank's other tables the statements join it with.
WHOLE = ("nvtx",)
INPUT_UNIT = "per-rank inputs"
# Whether the pass has a rank to map: one with a report that no map covers (`ranks` is read on
# PATH, where its view over the ranks to map comes first: the same rows for this join).
_TODO = ("SELECT count(*) > 0 FROM memory.main.map_todo t JOIN ranks r USING (rank) "
         "WHERE r.status IN ('ok', 'partial')")
_CREATE = re.compile(r"^CREATE (?:OR REPLACE )?(MACRO|TABLE|VIEW) (\w+)", re.I)


def schemas(con: duckdb.DuckDBPyConnection) -> None:
    """The pass's schemas, in the analysis's own catalog."""
    for s in (PASS, INPUTS):
        con.execute(f"CREATE SCHEMA IF NOT EXISTS memory.{s}")


def plan(modules: Sequence[sqlmodules.Module]) -> list[Unit]:
    """The analysis's units: each file as sqlrun plans it, the per-rank files run on PATH and
    followed by the statements that take their mapped tables, after one unit that makes their
    inputs (`inputs`), placed before the first of them (workers take units in order: the
    inputs unit can wait only for files before it)."""
    units = plan_modules(modules)
    first = next((i for i, m in enumerate(modules) if m.per_rank), None)
    if first is None:
        return units
    made = {p.name for m in modules if m.per_rank for p in m.provides}
    outside = sorted({r for m in modules if m.per_rank for r in m.reads if r not in made})
    late = sorted(set(outside) & {p.name for m in modules[first:] for p in m.provides})
    if late:
        raise sqlmodules.HeaderError(f"per-rank files read {late}, which a file after the first of them provides")
    deps = tuple(u.name for m, u in zip(modules[:first], units[:first], strict=True)
                 if (m.names | set(m.writes)) & {*outside, "map_todo"})
    out = [*units[:first], Unit(INPUT_UNIT, "", deps, call=functools.partial(inputs, names=tuple(outside)))]
    taken = {s.source: s for s in SUMMARIES}
    for m, u in zip(modules[first:], units[first:], strict=True):
        if not m.per_rank:
            out.append(u)
            continue
        made = _made(m)
        mapped = [(taken[p.name], made[p.name]) for p in m.provides if p.name in taken]
        sql = u.sql + "".join(f"\nCREATE OR REPLACE {kind} memory.main.{t.source} AS SELECT * FROM memory.{PASS}."
                              f"{t.source} UNION ALL BY NAME {t.taken('memory.main.map_ranks')};" for t, kind in mapped)
        out.append(Unit(u.name, sql, (*u.after, INPUT_UNIT), path=PATH,
                        call=functools.partial(_per_rank, sql=sql, idle=_idle(m, made, mapped))))
    return out


def _made(m: sqlmodules.Module) -> dict[str, str]:
    """What each statement of a per-rank file makes: name -> MACRO | TABLE | VIEW. A taken table
    is made as its file makes it: a view stays one (the compute islands are read where they are)."""
    return {x.group(2): x.group(1).upper() for st in duckdb.extract_statements(m.sql)
            if (x := _CREATE.match(sqlmodules.code(st.query)))}


def _idle(m: sqlmodules.Module, made: dict[str, str], mapped: Sequence[tuple[Summary, str]]) -> str:
    """What a per-rank file leaves when every rank is the map's: its macros, the map's rows of
    its mapped tables, and its other tables and views empty, for what reads them after the pass
    (each of the kind the file makes: an analysis run again on the connection replaces them)."""
    macros = [st.query.strip() for st in duckdb.extract_statements(m.sql)
              if (x := _CREATE.match(sqlmodules.code(st.query))) and x.group(1).upper() == "MACRO"]
    empty = [p for p in m.provides if made.get(p.name) != "MACRO" and p.name not in {t.source for t, _ in mapped}]
    return "".join([*(f"{q};\n" for q in macros),
                    *(f"CREATE OR REPLACE {made.get(p.name, 'TABLE')} memory.{PASS}.{p.name} AS SELECT "
                      + ", ".join(f'NULL AS "{c}"' for c in p.columns) + " WHERE false;\n" for p in empty),
                    *(f"CREATE OR REPLACE {kind} memory.main.{t.source} AS {t.taken('memory.main.map_ranks')};\n"
                      for t, kind in mapped)])


def _per_rank(con: duckdb.DuckDBPyConnection, sql: str, idle: str) -> None:
    """A per-rank file: its statements where a rank is left to map, else `idle`."""
    con.execute(sql if con.execute(_TODO).fetchone()[0] else idle)


def inputs(con: duckdb.DuckDBPyConnection, names: Sequence[str]) -> None:
    """Schema INPUTS: of each table or view in `names` with a rank column, a view of its rows of
    the ranks the pass maps (map_todo), over the one the analysis would read (its own catalog's,
    else the store's)."""
    rows = con.execute(
        "SELECT database_name, table_name FROM duckdb_columns() WHERE column_name = 'rank' "
        "AND schema_name = 'main' AND database_name IN ('memory', 'store') AND list_contains(?, table_name)",
        [[n for n in names if n not in WHOLE]]).fetchall()
    where: dict[str, str] = {}
    for db, table in rows:
        if db == "memory" or table not in where:
            where[table] = db
    for table, db in sorted(where.items()):
        con.execute(f'CREATE OR REPLACE VIEW memory.{INPUTS}."{table}" AS SELECT * FROM {db}.main."{table}" '
                    "SEMI JOIN memory.main.map_todo USING (rank)")
