"""Hold the SQL modules' headers (orchestrator/sqlmodules.py) and the rules' `reads` to
what really runs. Each module is executed by DuckDB on a connection that holds ONLY what its
header declares it reads (store tables, `params`, earlier modules' names, copied from a full
analysis of a real store): a name it reads without declaring it fails to bind. What it leaves
in the catalog must be what it declares it provides, with the declared columns. Rules are read
with Python's own parser (the view names they pass to `rows`/`by_rank`/`of_rank`, their
helpers' too) and DuckDB's (the tables named by SQL they run), and compared with their `reads`.

Problems are returned as sentences, one per drift, so that a test shows every one at once.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path

import duckdb

from orchestrator.analyze import rules as rules_pkg
from orchestrator.analyze.rules import base
from orchestrator.metrics import rankpass
from orchestrator.sqlmodules import Module

# (The per-rank files' inputs are views of other objects' rows, and the store's names they read
# a table of the pass's own: metrics/rankpass.py.)
_OBJECTS = f"""
    SELECT table_name, 'table' FROM duckdb_tables() WHERE database_name = 'memory'
        AND NOT starts_with(schema_name, '{rankpass.INPUTS_PREFIX}')
    UNION ALL SELECT view_name, 'view' FROM duckdb_views() WHERE database_name = 'memory' AND NOT internal
        AND NOT starts_with(schema_name, '{rankpass.INPUTS_PREFIX}')
    UNION ALL SELECT function_name, function_type FROM duckdb_functions()
        WHERE database_name = 'memory' AND function_type IN ('macro', 'table_macro') AND NOT internal
"""


def objects(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """Name -> table | view | macro | table_macro, of everything in the in-memory catalog (a
    name the per-rank pass and the files after it both have: the latter's, which it takes)."""
    return dict(con.execute(_OBJECTS).fetchall())


def columns(con: duckdb.DuckDBPyConnection, name: str, kind: str) -> tuple[str, ...]:
    """A table's or view's columns, or a macro's parameters, as DuckDB has them."""
    if kind in ("macro", "table_macro"):
        (params,), = con.execute("SELECT parameters FROM duckdb_functions() WHERE database_name = 'memory' "
                                 "AND function_name = ?", [name]).fetchall()
        return tuple(params)
    return tuple(r[0] for r in con.execute(f'DESCRIBE memory.main."{name}"').fetchall())


def declaration_problems(modules: Sequence[Module], store_tables: set[str]) -> list[str]:
    """What the headers get wrong on their own: a read nobody earlier provides, another file's
    private name, a name provided twice."""
    out, seen = [], {"params": "engine"}
    for m in modules:
        for r in (*m.reads, *m.writes):
            if r.startswith("_"):
                out.append(f"{m.file} reads {r}: a private name (leading `_`) is its own file's only")
            elif r not in seen and r not in store_tables:
                out.append(f"{m.file} reads {r}: no store table, `params` or earlier module provides it")
        for p in m.provides:
            if p.name in seen:
                out.append(f"{m.file} provides {p.name}, which {seen[p.name]} provides already")
            seen[p.name] = m.file
    return out


def materialize(full: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Every analysis table and view of `full` as a table of a DuckDB file (macros stay in
    `full`'s catalog, recreated from there)."""
    full.execute(f"ATTACH '{path}' AS snap")
    for name, kind in objects(full).items():
        if kind in ("table", "view"):
            full.execute(f'CREATE TABLE snap.main."{name}" AS SELECT * FROM "{name}"')
    full.execute("DETACH snap")


def _macro_sql(full: duckdb.DuckDBPyConnection, name: str) -> str:
    (kind, params, body), = full.execute(
        "SELECT function_type, parameters, macro_definition FROM duckdb_functions() "
        "WHERE database_name = 'memory' AND function_name = ?", [name]).fetchall()
    return f"CREATE MACRO {name}({', '.join(params)}) AS {'TABLE ' if kind == 'table_macro' else ''}{body}"


_MISSING = re.compile(r"with name (\w+) does not exist", re.IGNORECASE)


def run_declared(m: Module, modules: Sequence[Module], full: duckdb.DuckDBPyConnection, store: Path,
                 snap: Path) -> list[str]:
    """Run module `m` where only its declared reads exist; the drifts it shows. A name it reads
    undeclared fails to bind: it is reported, added, and the module run again, so that one
    run lists every undeclared read."""
    extra: list[str] = []
    while True:
        try:
            return [f"{m.file} reads {x} without declaring it in `-- Reads:`" for x in extra] + _run_once(
                m, modules, full, store, snap, extra)
        except duckdb.Error as e:
            miss = _MISSING.search(str(e))
            if not miss or miss.group(1) in extra or len(extra) > 50:
                return [f"{m.file} fails with only its declared reads: {str(e).splitlines()[0]}"]
            extra.append(miss.group(1))


def _run_once(m: Module, modules: Sequence[Module], full: duckdb.DuckDBPyConnection, store: Path, snap: Path,
              extra: Sequence[str]) -> list[str]:
    kinds = objects(full)
    provider = {p.name: x for x in modules for p in x.provides}
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH '{store}' AS store (READ_ONLY)")
        con.execute(f"ATTACH '{snap}' AS snap (READ_ONLY)")
        stored = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                            "WHERE table_catalog = 'store'"
                                            ).fetchall()}
        macros: list[str] = []  # a macro's body is bound where it is called: bring what it calls

        def need_macro(name: str) -> None:
            if name not in macros:
                macros.append(name)
                for r in provider[name].reads:
                    if kinds.get(r) in ("macro", "table_macro"):
                        need_macro(r)
        for r in dict.fromkeys((*m.reads, *m.writes, *extra)):
            if kinds.get(r) in ("macro", "table_macro"):
                need_macro(r)
            elif r in kinds:
                con.execute(f'CREATE {"TABLE" if r in m.writes else "VIEW"} "{r}" AS SELECT * FROM snap.main."{r}"')
            elif r in stored:  # a copy, not a view: the analysis reads some tables' rowid; the small
                # ones whole, as the analysis's tables are (the rank sets of both are checked against each other)
                n, = con.execute(f'SELECT count(*) FROM store.main."{r}"').fetchone()
                con.execute(f'CREATE TABLE "{r}" AS SELECT * FROM store.main."{r}"{" LIMIT 0" if n > 10_000 else ""}')
        for name in reversed(macros):
            con.execute(_macro_sql(full, name))
        con.execute("SET search_path = 'memory.main'")  # the store's tables only through the copies above
        con.execute("SET asof_loop_join_threshold = 0")
        before = set(objects(con))
        con.execute(m.sql)
        made = objects(con)
        out = [f"{m.file} creates {n}, which its header does not provide" for n in sorted(set(made) - before - m.names)]
        for p in m.provides:
            if p.name not in made:
                if not p.private:
                    out.append(f"{m.file} provides {p.name}, which it never creates")
                continue
            real = columns(con, p.name, made[p.name])
            if real != p.columns:
                out.append(f"{m.file}: {p.name}({', '.join(p.columns)}) is really {p.name}({', '.join(real)})")
        return out
    finally:
        con.close()


def sql_tables(sql: str) -> set[str]:
    """Names a SELECT reads, from DuckDB's own parse tree (CTE names left out)."""
    tree = json.loads(duckdb.execute("SELECT json_serialize_sql(?::VARCHAR)", [sql]).fetchone()[0])
    if tree.get("error"):
        raise ValueError(f"DuckDB cannot parse {sql!r}: {tree.get('error_message')}")
    found: set[str] = set()
    ctes: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("type") == "BASE_TABLE" and "table_name" in node:
                found.add(node["table_name"])
            for entry in (node.get("cte_map") or {}).get("map", []) if isinstance(node.get("cte_map"), dict) else []:
                ctes.add(entry.get("key", ""))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(tree)
    return found - ctes


def reads_in(tree: ast.AST, helpers: dict[str, set[str]], where: str) -> tuple[set[str], list[str]]:
    """Views a piece of Python reads: literal names passed to `.rows`/`.by_rank`/`.of_rank`, the
    tables of literal SQL passed to `.query`/`.scalar`, and what the base helpers it calls read."""
    found: set[str] = set()
    problems: list[str] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in ("rows", "by_rank", "of_rank", "query", "scalar"):
            arg = node.args[0] if node.args else None
            if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                problems.append(f"{where}: .{f.attr}() of a computed name, which no check can follow: use a literal")
            elif f.attr in ("rows", "by_rank", "of_rank"):
                found.add(arg.value)
            else:
                found |= sql_tables(arg.value)
        elif isinstance(f, ast.Name) and f.id in helpers:
            found |= helpers[f.id]
        elif (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Attribute) and f.value.attr == "RULE"
              and isinstance(f.value.value, ast.Name)):  # another rule's method: `straggler.RULE.reported(ctx)`
            other = importlib.import_module(f"{rules_pkg.__name__}.{f.value.value.id}").RULE
            src = textwrap.dedent(inspect.getsource(getattr(type(other), f.attr)))
            sub, probs = reads_in(ast.parse(src), helpers, f"{where} (through {f.value.value.id}.{f.attr})")
            found |= sub
            problems += probs
    return found, problems


def rule_problems(provided: set[str], rules: Sequence[base.Rule] | None = None) -> list[str]:
    """Every rule's real reads against its `reads` and against the modules' public names."""
    base_tree = ast.parse(inspect.getsource(base))
    helpers = {fn.name: reads_in(fn, {}, f"base.{fn.name}")[0]
               for fn in base_tree.body if isinstance(fn, ast.FunctionDef)}
    out = []
    for rule in rules_pkg.registry() if rules is None else rules:
        name = Path(inspect.getfile(type(rule))).name
        real: set[str] = set()
        for cls in type(rule).__mro__:  # an inherited evaluate reads what its own module says
            mod = inspect.getmodule(cls)
            if isinstance(cls, type) and issubclass(cls, base.Rule) and cls is not base.Rule and mod:
                found, problems = reads_in(ast.parse(inspect.getsource(mod)), helpers, name)
                real |= found
                out += problems
        declared = set(rule.reads)
        out += [f"rules/{name} reads {v}, which no SQL module provides" for v in sorted(real - provided)]
        out += [f"rules/{name} reads {v} without listing it in `reads`" for v in sorted(real - declared)]
        out += [f"rules/{name} lists {v} in `reads` but never reads it" for v in sorted(declared - real)]
    return out
