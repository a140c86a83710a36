"""The analysis's per-rank pass: the map's own SQL, run in the report over the ranks whose map
it cannot take.

A `-- Map: per rank` file (sqlmodules.py) computes what needs one rank's rows alone. The map
runs it on its one-rank store. The analysis runs the same statements once, over every rank
whose map it cannot take: a rank outside the file's key, the ranks whose map is taken (KEYS:
map_ranks, the map measured in the report's own scope, 21_stats_scope.sql; map_done, the map
ran this SQL, for what no option changes, 05_mapped.sql). There, each name the file reads from
the store or from a file that is not its key's per-rank file is a view of that name's rows of
those ranks only (a schema of the file's own, first on its search path after the pass's), and
what the file creates goes to its key's pass schema. Each table the map writes is then taken,
under its own name, as the pass's rows and the map's rows of the key's ranks, their times moved
onto the store's clock (store/map_tables.py: `Summary.taken`). So one statement computes each
per-rank table, and no file writes the other ranks' half. Where every rank with a report is
the map's, the file's statements do not run (`_idle`). The files after the pass read the taken
tables first, then the pass's own helpers (the search path of `engine.session`). A view binds
its names where it is read: a per-rank file's views read only its pass's own tables
(tests/test_sql_modules.py), never an input, which a reader after the pass would see whole.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

import duckdb

from orchestrator import sqlmodules
from orchestrator.metrics.sqlrun import Unit, plan_modules
from orchestrator.store.map_tables import SUMMARIES, Summary

# A per-rank file's key (the ranks whose map is taken, or that need nothing of the file) -> the
# ranks the analysis maps itself (every other rank, and -1: 21_stats_scope.sql says why).
KEYS = {"map_ranks": "map_todo", "map_done": "map_none", "ops_mapped": "ops_todo", "steps_known": "steps_todo"}
# Read by rowid (17_cpu_ranges.sql keys the ranges by it), which a view has not: read whole,
# its rows narrowed by the rank's other tables the statements join it with.
WHOLE = ("nvtx",)
# Whether a pass has a rank to map: one with a report that no map covers.
_TODO = "SELECT count(*) > 0 FROM memory.main.{todo} t JOIN ranks r USING (rank) WHERE r.status IN ('ok', 'partial')"
_MACRO = re.compile(r"^CREATE (?:OR REPLACE )?MACRO (\w+)", re.I | re.M)
_TABLE_MACRO = re.compile(r"^CREATE (?:OR REPLACE )?MACRO \w+\s*\([^)]*\)\s*AS TABLE\b", re.I)


def pass_schema(key: str) -> str:
    """Where the per-rank files of `key` create what they make."""
    return f"rank_pass_{key}"


# The analysis's own objects, then the passes' (their helpers), then the store's.
SEARCH = ",".join(["memory.main", *(f"memory.{pass_schema(k)}" for k in KEYS), "store.main"])


INPUTS_PREFIX = "rank_in_"
# The names the analysis reads from the store with a rank column (`catalog`).
_STORE_NAMES = f"memory.{INPUTS_PREFIX}store.names"


def _inputs_schema(m: sqlmodules.Module) -> str:
    return INPUTS_PREFIX + re.sub(r"\W", "_", m.file.removesuffix(".sql"))


def schemas(con: duckdb.DuckDBPyConnection) -> None:
    """The passes' schemas and each per-rank file's inputs' schema, in the analysis's own catalog."""
    names = [*(pass_schema(k) for k in KEYS), f"{INPUTS_PREFIX}store",
             *(_inputs_schema(m) for m in sqlmodules.analysis_modules() if m.per_rank)]
    for s in names:
        con.execute(f"CREATE SCHEMA IF NOT EXISTS memory.{s}")


def plan(modules: Sequence[sqlmodules.Module]) -> list[Unit]:
    """The analysis's units: each file as sqlrun plans it, each per-rank file run on its own
    search path, making its inputs first (`inputs`) and taking its mapped tables after."""
    units = plan_modules(modules)
    providers = {p.name: u.name for m, u in zip(modules, units, strict=True) for p in m.provides}
    taken = {s.source: s for s in SUMMARIES}
    made_at = _made_at(modules)
    partial = _partial(modules)
    out = []
    for m, u in zip(modules, units, strict=True):
        if not m.per_rank:
            if half := sorted(set(m.reads) & set(partial)):
                raise sqlmodules.HeaderError(
                    f"{m.file} reads {', '.join(half)}, which {partial[half[0]]} makes for the ranks of its "
                    "per-rank pass alone; read what the map writes of it (store/map_tables.py) or make it "
                    "in the file across ranks")
            out.append(u)
            continue
        if m.per_rank not in KEYS:
            raise sqlmodules.HeaderError(f"{m.file}: `-- Map: per rank ({m.per_rank})`: "
                                         f"the key is one of {sorted(KEYS)}")
        key, todo = m.per_rank, KEYS[m.per_rank]
        own = {p.name for x in modules if x.per_rank == key for p in x.provides}
        ins = tuple(sorted(r for r in m.reads if r not in own))
        made = _made(m)
        mapped = [(taken[p.name], made[p.name][0]) for p in m.provides if p.name in taken]
        sql = u.sql + "".join(f"\nCREATE OR REPLACE {kind} memory.main.{t.source} AS SELECT * FROM "
                              f"memory.{pass_schema(key)}.{t.source} UNION ALL BY NAME "
                              f"{t.taken(f'memory.main.{key}')};" for t, kind in mapped)
        schema = _inputs_schema(m)
        others = [f"memory.{pass_schema(k)}" for k in KEYS if k != key]
        path = ",".join([f"memory.{pass_schema(key)}", f"memory.{schema}", "memory.main", *others, "store.main"])
        after = tuple(dict.fromkeys((*u.after, providers[key], providers[todo])))
        outside = {r for x in modules if x is not m for r in x.reads}
        ranked = {r: made_at[r] for r in ins if r in made_at}
        store = tuple(r for r in ins if r not in providers and r not in WHOLE)
        out.append(Unit(u.name, sql, after, path=path, drop=u.drop, call=functools.partial(
            _per_rank, schema=schema, made_at=ranked, store=store, todo=todo, sql=sql,
            idle=_idle(m, key, made, mapped, outside))))
    return out


def _partial(modules: Sequence[sqlmodules.Module]) -> dict[str, str]:
    """The per-rank files' tables and views that hold only their pass's ranks (every one but a
    macro, a table the map writes, which the analysis takes whole, and `WHOLE`) -> the file: no
    file across ranks may read them."""
    taken = {s.source for s in SUMMARIES}
    return {p.name: x.file for x in modules if x.per_rank for p in x.provides
            if p.name not in taken and p.name not in WHOLE and p.name not in set(_MACRO.findall(x.sql))}


def _made_at(modules: Sequence[sqlmodules.Module]) -> dict[str, str]:
    """Where the analysis makes each of its tables and views with a rank column (its header's
    columns say which): a per-rank file's in its pass's schema, but the tables the map writes,
    which it takes into the analysis's own; any other file's there too."""
    taken = {s.source for s in SUMMARIES}
    out = {}
    for x in modules:
        macros = set(_MACRO.findall(x.sql))
        for p in x.provides:
            if p.name not in macros and "rank" in p.columns and p.name not in WHOLE:
                out[p.name] = (f"memory.{pass_schema(x.per_rank)}" if x.per_rank and p.name not in taken
                               else "memory.main")
    return out


def table_macro(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """Make the table macro `name` of a per-rank file in the analysis's own catalog, over every
    rank's events, for a reader after the analysis (the timeline draws a few ranks' GPU work)."""
    for m in sqlmodules.analysis_modules():
        if m.per_rank and name in (made := _made(m)):
            con.execute(made[name][1])
            return
    raise KeyError(name)


def _made(m: sqlmodules.Module) -> dict[str, tuple[str, str]]:
    """What each statement of a per-rank file makes: name -> (MACRO | TABLE | VIEW, the statement).
    A taken table is made as its file makes it: a view stays one (the compute islands are read
    where they are)."""
    return {name: (kind, query) for kind, name, query, _ in sqlmodules.created(m.sql)}


def _idle(m: sqlmodules.Module, key: str, made: dict[str, tuple[str, str]],
          mapped: Sequence[tuple[Summary, str]], outside: set[str]) -> str:
    """What a per-rank file leaves when every rank is the map's: the macros other files read
    (`outside`: their Reads), the map's rows of its mapped tables, and its other public tables
    and views empty, for what reads them after the pass (each of the kind the file makes: an
    analysis run again on the connection replaces them). Not its table macros: DuckDB binds one
    where it is made, reading the events it names, which is what the pass must not do (a reader
    after it makes one with `table_macro`). Nor its private helpers, which nothing outside the
    file reads."""
    kind = {name: k for name, (k, _) in made.items()}
    empty = [p for p in m.public if kind.get(p.name) != "MACRO" and p.name not in {t.source for t, _ in mapped}]
    macros = [q for name, (k, q) in made.items()
              if k == "MACRO" and name in outside and not _TABLE_MACRO.match(sqlmodules.code(q))]
    return "".join([*(f"{q};\n" for q in macros),
                    *(f"CREATE OR REPLACE {kind.get(p.name, 'TABLE')} memory.{pass_schema(key)}.{p.name} AS "
                      "SELECT " + _nulls(p) + " WHERE false;\n" for p in empty),
                    *(f"CREATE OR REPLACE {k} memory.main.{t.source} AS {t.taken(f'memory.main.{key}')};\n"
                      for t, k in mapped)])


def _nulls(p: sqlmodules.Provided) -> str:
    """A row of NULLs in a provided name's columns, of its header's types where it gives them."""
    types = p.types or ("",) * len(p.columns)
    return ", ".join(f'CAST(NULL AS {t}) AS "{c}"' if t else f'NULL AS "{c}"'
                     for c, t in zip(p.columns, types, strict=True))


def _per_rank(con: duckdb.DuckDBPyConnection, schema: str, made_at: dict[str, str], store: Sequence[str],
              todo: str, sql: str, idle: str) -> None:
    """A per-rank file: its inputs and its statements where a rank is left to map, else `idle`."""
    if con.execute(_TODO.format(todo=todo)).fetchone()[0]:
        inputs(con, schema, made_at, store, todo)
        con.execute(sql)
    else:
        con.execute(idle)


def catalog(con: duckdb.DuckDBPyConnection) -> None:
    """Which of the names the analysis reads from the store have a rank column, and where it
    reads each (its own catalog's view first: a moved run's parts, an empty map table; else the
    store's), read once before the analysis: the catalog function lists every column of both
    catalogs, a cost each per-rank file would otherwise pay."""
    con.execute(f"CREATE OR REPLACE TABLE {_STORE_NAMES} AS SELECT DISTINCT database_name AS db, table_name AS name "
                "FROM duckdb_columns() WHERE column_name = 'rank' AND schema_name = 'main' "
                "AND database_name IN ('memory', 'store')")


def inputs(con: duckdb.DuckDBPyConnection, schema: str, made_at: dict[str, str], store: Sequence[str],
           todo: str) -> None:
    """In `schema`: of each name the file reads with a rank column, a view of its rows of the
    ranks in `todo`, over the one the analysis would read: `made_at` where the analysis makes
    them (plan), and of `store`, the names it reads from the store, those `catalog` found."""
    where = dict(made_at)
    if store:  # (no value bound: DuckDB's client binding a Python list looks for pandas once per element)
        for db, name in con.execute(f"SELECT db, name FROM {_STORE_NAMES} ORDER BY db = 'store'").fetchall():
            if name in store and name not in where:
                where[name] = f"{db}.main"
    for table, rel in sorted(where.items()):
        con.execute(f'CREATE OR REPLACE VIEW memory.{schema}."{table}" AS SELECT * FROM {rel}."{table}" '
                    f"SEMI JOIN memory.main.{todo} USING (rank)")
