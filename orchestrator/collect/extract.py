"""Per-table SELECTs that turn one nsys export into the store's columns (the map step),
generated from the registry in tables.py.

The same SQL runs in DuckDB over the attached SQLite file (fast path: sqlite scanner) and in
SQLite itself (fallback: sqlite3 -> Arrow -> DuckDB), so it sticks to the common dialect.
Columns a given nsys version lacks become NULL; missing tables yield no query at all. Every
SELECT names its output columns so that inserts go by name (`insert_sql`), never by position.

A table with a row filter (`Table.where`, e.g. OS runtime calls >= 10 us) is filtered INSIDE
SQLite on the scanner path: DuckDB's sqlite scanner pushes projections but not filters, so it
would convert every row of OSRT_API (the largest table of a CPU-heavy capture) into vectors
only to keep a small share of them (docs/benchmarks-code.md). `sqlite_query(db, sql)` lets
SQLite evaluate the filter and hand over only the kept rows; the inner query selects plain
columns only, so their declared INTEGER/TEXT types survive (an expression would come back as
VARCHAR), and the string joins, clock shift and enum mapping stay in DuckDB exactly as for
every other table.
"""

from __future__ import annotations

from orchestrator.collect.probe import Probe
from orchestrator.store.tables import TABLES, Col, Table

# NVTX event types: 59 push/pop range, 60 start/end range, 75 domain create.
NVTX_RANGE_TYPES = (59, 60)
# Strings from a trace are cut to this many characters: the program controls them, and a
# megabyte NVTX text on every range would otherwise take the collect's memory (real names,
# even demangled C++ templates, stay far below).
MAX_TEXT = 16384


def tables_for_missing_columns(p: Probe) -> dict[str, list[str]]:
    """The part of `p.tables` that missing_columns looks at: the event tables' sources, only
    their expected columns. A map's meta keeps just this, so that the reduce holds a few
    names per rank instead of every table and column of the export (~80 tables)."""
    out: dict[str, set[str]] = {}
    for t in TABLES.values():
        if p.has(t.source):
            out.setdefault(t.source, set()).update(c for g in t.expected for c in g if p.has(t.source, c))
    return {t: sorted(cols) for t, cols in out.items()}


def missing_columns(p: Probe) -> list[str]:
    """'TABLE.column' for every expected column group a present source table lacks."""
    out = []
    for t in TABLES.values():
        if not p.has(t.source):
            continue
        for group in t.expected:
            if not any(p.has(t.source, c) for c in group):
                out.append(f"{t.source}.{group[0]}")
    return list(dict.fromkeys(out))


def _case(expr: str, mapping: dict[int, str], default: str = "'unknown'") -> str:
    whens = " ".join(f"WHEN {k} THEN '{v}'" for k, v in mapping.items())
    return f"CASE {expr} {whens} ELSE {default} END"


class _Ctx:
    """One SELECT being built: its joins, the schema prefix and the clock offset."""

    def __init__(self, t: Table, p: Probe, s: str, offset_ns: int, pushdown_db: str | None = None) -> None:
        self.t, self.p, self.s, self.offset = t, p, s, int(offset_ns)
        self.pushdown_db = pushdown_db
        self.joins: list[str] = []

    def ref(self, col: Col) -> str | None:
        present = [c for c in col.src if self.p.has(self.t.source, c)]
        if not present:
            return None
        refs = [f'x."{c}"' for c in present]
        return refs[0] if len(refs) == 1 else f"coalesce({', '.join(refs)})"

    def strings(self) -> str:
        """StringIds, deduplicated when its ids are not guaranteed unique (a duplicated id
        must not multiply the rows that reference it)."""
        if self.p.string_ids_unique:
            return f"{self.s}StringIds"
        return f"(SELECT id, min(value) AS value FROM {self.s}StringIds GROUP BY id)"

    def string(self, ref: str) -> str:
        if not self.p.has("StringIds"):
            return "NULL"
        a = f"j{len(self.joins)}"
        self.joins.append(f" LEFT JOIN {self.strings()} {a} ON {a}.id = {ref}")
        return f"{a}.value"

    def expr(self, col: Col) -> str:
        e = self._expr(col)
        return f"substr({e}, 1, {MAX_TEXT})" if col.type == "VARCHAR" and col.how != "enum" and e != "NULL" else e

    def _expr(self, col: Col) -> str:
        if col.how == "text_or_string":
            plain = f'x."{col.src[0]}"' if self.p.has(self.t.source, col.src[0]) else "NULL"
            sid = f'x."{col.src[1]}"' if self.p.has(self.t.source, col.src[1]) else None
            return f"coalesce({plain}, {self.string(sid)})" if sid else plain
        if col.how == "expr":
            return col.expr if all(self.p.has(self.t.source, c) for c in col.src) else "NULL"
        ref = self.ref(col)
        if col.how == "enum":
            return _case(ref or "NULL", dict(col.enum or {}))
        if ref is None:
            return "NULL"
        if col.how == "time":
            return f"{ref} + {self.offset}"
        if col.how == "string":
            return self.string(ref)
        return ref

    def source(self) -> str:
        if self.t.from_sql:
            return self.t.from_sql.format(s=self.s)
        if self.pushed:
            return _pushed_source(self.t, self.p, str(self.pushdown_db))
        return f"{self.s}{self.t.source}"

    @property
    def pushed(self) -> bool:
        """True when the row filter runs inside SQLite (scanner path, filterable table)."""
        return bool(self.pushdown_db and self.t.where and self.filterable)

    @property
    def filterable(self) -> bool:
        return all(self.p.has(self.t.source, c) for c in ("start", "end"))


def _sq(text: str) -> str:
    return text.replace("'", "''")


def _pushed_source(t: Table, p: Probe, db: str) -> str:
    """`sqlite_query` over attached `db`: the present source columns of `t` (integers: every
    column a filterable table reads is one), its filter applied by SQLite. `sqlite_query`
    returns text, so DuckDB casts back; a kept value that is not an integer fails the rank as
    the scanner's own type check would (rows the filter drops are never looked at)."""
    cols = list(dict.fromkeys(c for col in t.columns for c in col.src if p.has(t.source, c)))
    cols += [c for c in ("start", "end") if c not in cols]
    q = ['x."' + c.replace('"', '""') + '"' for c in cols]
    ok = " AND ".join(f"typeof({c}) IN ('integer', 'null')" for c in q)
    inner = f'SELECT {", ".join(q)}, ({ok}) AS orch_ok FROM "{t.source}" x WHERE {t.where}'
    casts = ", ".join(f'CAST({c} AS BIGINT) AS {c[2:]}' for c in q)
    bad = _sq(f"Mismatch Type Error: {t.source} holds a value that is not an integer")
    return (f"(SELECT {casts} FROM sqlite_query('{_sq(db)}', '{_sq(inner)}') x "
            f"WHERE CASE WHEN x.orch_ok = '1' THEN true ELSE error('{bad}') END)")


def select_sql(table: str, p: Probe, rank: int, offset_ns: int, s: str,
               pushdown_db: str | None = None) -> str | None:
    """SELECT for store `table` from probe `p`, its output columns named as the store's;
    `s` is the schema prefix ('' or 'src0.'); `pushdown_db` (scanner path: the attached
    database's name) makes SQLite apply the table's row filter (see the module docstring)."""
    t = TABLES[table]
    first_time = next((c for c in t.columns if c.how == "time"), None)
    if not p.has(t.source) or (first_time and not p.has(t.source, first_time.src[0])):
        return None
    ctx = _Ctx(t, p, s, offset_ns, pushdown_db)
    if t.builder == "nvtx":
        return _nvtx(ctx, int(rank))
    exprs = {c.name: ctx.expr(c) for c in t.columns if c.how != "builder"}
    if t.builder == "gpu_metrics":
        if not (p.has("TARGET_INFO_GPU_METRICS") and p.has(t.source, "metricId") and p.has(t.source, "typeId")):
            return None
        exprs["metric"] = f"substr(m.metricName, 1, {MAX_TEXT})"
        ctx.joins.append(f" JOIN {s}TARGET_INFO_GPU_METRICS m ON m.typeId = x.typeId AND m.metricId = x.metricId")
    if t.builder == "threads":
        if p.has("PROCESSES", "globalPid") and p.has("PROCESSES", "name") and p.has(t.source, "globalTid"):
            exprs["process"] = f"substr(pr.pname, 1, {MAX_TEXT})"
            ctx.joins.append(f" LEFT JOIN (SELECT globalPid, min(name) AS pname FROM {s}PROCESSES GROUP BY globalPid)"
                             " pr ON pr.globalPid = x.globalTid - (x.globalTid & 16777215)")
        else:
            exprs["process"] = "NULL"
    cols = [f"{int(rank)} AS rank"] + [f'{exprs[c.name]} AS "{c.name}"' for c in t.columns]
    where = f" WHERE {t.where}" if t.where and ctx.filterable and not ctx.pushed else ""
    return f"SELECT {', '.join(cols)} FROM {ctx.source()} x{''.join(ctx.joins)}{where}"


def _nvtx(ctx: _Ctx, rank: int) -> str:
    p, t, src = ctx.p, ctx.t, ctx.t.source
    tbl = f"{ctx.s}{src}"
    by = {c.name: c for c in t.columns}
    start, end, tid = ctx.expr(by["start"]), ctx.expr(by["end"]), ctx.expr(by["tid"])
    text = ctx.expr(by["text"])
    payload = ctx.expr(by["payload"])
    dom = 'x."domainId"' if p.has(src, "domainId") else "0"
    if p.has(src, "domainId") and p.has(src, "eventType"):
        dom_name = f"CASE WHEN {dom} = 0 THEN 'default' ELSE substr(dm.dname, 1, {MAX_TEXT}) END"
        names = "SELECT domainId AS did, min(text) AS dname FROM {} WHERE eventType = 75 GROUP BY domainId"
        if ctx.pushdown_db:  # SQLite picks the few domain-create rows (the scanner would convert all)
            inner = _sq(names.format(f'"{src}"'))
            names = f"SELECT CAST(did AS BIGINT) AS did, dname FROM sqlite_query('{_sq(ctx.pushdown_db)}', '{inner}')"
        else:
            names = names.format(tbl)
        ctx.joins.append(f" LEFT JOIN ({names}) dm ON dm.did = x.domainId")
    else:
        dom_name = "'default'"
    types = ", ".join(str(v) for v in NVTX_RANGE_TYPES)
    where = 'x."end" IS NOT NULL' + (f" AND x.eventType IN ({types})" if p.has(src, "eventType") else "")
    # Nesting depth per (thread, domain), computed here per rank (map step, in parallel): a
    # running count of open ranges; at equal times ends come before starts (siblings) and
    # longer ranges open first (parents). One running sum over the rank's events sorted by
    # (thread, domain, time) is that count per (thread, domain): each (thread, domain) adds one
    # +1 and one -1 per range, so the sum is back at 0 where the next one begins (DuckDB's
    # partitioned running sum is slower: docs/benchmarks-code.md). Ranges that end
    # before they start are impossible: they get no depth, take no part in the count, and are
    # dropped (and counted) at finalize.
    # r is read three times: MATERIALIZED reads the export once (SQLite's own dialect, the
    # sqlite3 path, may predate the keyword).
    mat = "MATERIALIZED " if ctx.pushdown_db else ""
    return (
        f"WITH r AS {mat}(SELECT row_number() OVER () AS id, {start} AS s, {end} AS e, "
        f"{tid} AS tid, {dom} AS dom, {dom_name} AS dname, {text} AS txt, {payload} AS payload "
        f"FROM {tbl} x{''.join(ctx.joins)} WHERE {where}), "
        "ev AS (SELECT id, tid, dom, s AS ts, 1 AS kind, e FROM r WHERE e >= s "
        "UNION ALL SELECT NULL, tid, dom, e, 0, NULL FROM r WHERE e >= s), "
        "run AS (SELECT id, sum(CASE WHEN kind = 1 THEN 1 ELSE -1 END) OVER (ORDER BY tid, dom, "
        "ts, kind, e DESC ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) - 1 AS depth "
        "FROM ev) "
        f'SELECT {rank} AS rank, r.s AS "start", r.e AS "end", r.tid AS "tid", r.dom AS "domain_id", '
        'r.dname AS "domain", r.txt AS "text", CAST(run.depth AS INTEGER) AS "depth", '
        'r.payload AS "payload" '
        "FROM r LEFT JOIN run ON run.id = r.id"
    )


def insert_sql(target: str, table: str, select: str) -> str:
    """INSERT naming the store's columns (never by position)."""
    names = ", ".join(f'"{c}"' for c, _ in TABLES[table].store_columns)
    return f"INSERT INTO {target} ({names}) {select}"
