"""Per-table SELECTs that turn one nsys export into the store's columns (the map step).

The same SQL runs in DuckDB over the attached SQLite file (fast path: sqlite scanner) and in
SQLite itself (fallback: sqlite3 -> Arrow -> DuckDB), so it sticks to the common dialect.
Columns a given nsys version lacks become NULL; missing tables yield no query at all.
"""

from __future__ import annotations

from orchestrator.collect.probe import EVENT_TABLES, Probe

# CUPTI enums (stable across nsys versions; the ENUM_* tables are not always exported).
_COPY_KIND = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
              8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "UVM HtoD", 12: "UVM DtoH", 13: "UVM DtoD"}
_MEM_KIND = {0: "pageable", 1: "pinned", 2: "device", 3: "array", 4: "managed",
             5: "device static", 6: "managed static"}
# NVTX event types: 59 push/pop range, 60 start/end range, 75 domain create.
NVTX_RANGE_TYPES = (59, 60)


# Columns each source table should have; a missing one becomes NULL and a note on the rank.
EXPECTED_COLUMNS = {
    "CUPTI_ACTIVITY_KIND_KERNEL": ("start", "end", "deviceId", "streamId", "correlationId", "shortName",
                                   "demangledName"),
    "CUPTI_ACTIVITY_KIND_MEMCPY": ("start", "end", "deviceId", "streamId", "correlationId", "copyKind", "bytes",
                                   "srcKind", "dstKind"),
    "CUPTI_ACTIVITY_KIND_MEMSET": ("start", "end", "deviceId", "streamId", "correlationId", "bytes"),
    "CUPTI_ACTIVITY_KIND_RUNTIME": ("start", "end", "globalTid", "correlationId", "nameId"),
    "NVTX_EVENTS": ("start", "end", "eventType", "globalTid", "domainId"),
}


def missing_columns(p: Probe) -> list[str]:
    """'TABLE.column' for every expected column a present table lacks."""
    return [f"{t}.{c}" for t, cols in EXPECTED_COLUMNS.items() if p.has(t) for c in cols if not p.has(t, c)]


def _case(expr: str, mapping: dict[int, str], default: str = "'unknown'") -> str:
    whens = " ".join(f"WHEN {k} THEN '{v}'" for k, v in mapping.items())
    return f"CASE {expr} {whens} ELSE {default} END"


def _col(p: Probe, table: str, alias: str, column: str, default: str = "NULL") -> str:
    return f'{alias}."{column}"' if p.has(table, column) else default


def _string(p: Probe, s: str, table: str, alias: str, column: str, join_alias: str) -> tuple[str, str]:
    """(select expression, join clause) for a StringIds reference column."""
    if not (p.has(table, column) and p.has("StringIds")):
        return "NULL", ""
    return f"{join_alias}.value", f' LEFT JOIN {s}StringIds {join_alias} ON {join_alias}.id = {alias}."{column}"'


def select_sql(table: str, p: Probe, rank: int, offset_ns: int, s: str) -> str | None:
    """SELECT for store `table` from probe `p`; `s` is the schema prefix ('' or 'src.')."""
    src = EVENT_TABLES[table]
    if not p.has(src) or (table != "gpu_metrics" and not p.has(src, "start")):
        return None
    t = f"{s}{src}"
    start = f'x."start" + {offset_ns}'
    if table in ("kernels", "memcpy", "memset", "cuda_api", "nvtx"):
        end = f'x."end" + {offset_ns}'
    if table == "kernels":
        short, j1 = _string(p, s, src, "x", "shortName", "sn")
        name, j2 = _string(p, s, src, "x", "demangledName", "dn")
        return (
            f"SELECT {rank}, {start}, {end}, {_col(p, src, 'x', 'deviceId')}, "
            f"{_col(p, src, 'x', 'streamId')}, {_col(p, src, 'x', 'correlationId')}, {short}, {name}, "
            f"CASE WHEN substr({short}, 1, 4) = 'nccl' THEN 'comm' ELSE 'compute' END "
            f"FROM {t} x{j1}{j2}"
        )
    if table == "memcpy":
        return (
            f"SELECT {rank}, {start}, {end}, {_col(p, src, 'x', 'deviceId')}, "
            f"{_col(p, src, 'x', 'streamId')}, {_col(p, src, 'x', 'correlationId')}, "
            f"{_case(_col(p, src, 'x', 'copyKind'), _COPY_KIND)}, {_col(p, src, 'x', 'bytes')}, "
            f"{_case(_col(p, src, 'x', 'srcKind'), _MEM_KIND)}, "
            f"{_case(_col(p, src, 'x', 'dstKind'), _MEM_KIND)} FROM {t} x"
        )
    if table == "memset":
        return (
            f"SELECT {rank}, {start}, {end}, {_col(p, src, 'x', 'deviceId')}, "
            f"{_col(p, src, 'x', 'streamId')}, {_col(p, src, 'x', 'correlationId')}, "
            f"{_col(p, src, 'x', 'bytes')} FROM {t} x"
        )
    if table == "cuda_api":
        name, j = _string(p, s, src, "x", "nameId", "sn")
        return (
            f"SELECT {rank}, {start}, {end}, {_col(p, src, 'x', 'globalTid')}, "
            f"{_col(p, src, 'x', 'correlationId')}, {name} FROM {t} x{j}"
        )
    if table == "nvtx":
        # Registered strings live in StringIds (textId), plain ones in `text`.
        txt, j = _string(p, s, src, "x", "textId", "sn")
        text = f"coalesce({_col(p, src, 'x', 'text')}, {txt})"
        dom = _col(p, src, "x", "domainId", "0")
        if p.has(src, "domainId") and p.has(src, "eventType"):
            dom_name = f"CASE WHEN {dom} = 0 THEN 'default' ELSE dm.dname END"
            j += (f" LEFT JOIN (SELECT domainId AS did, min(text) AS dname FROM {t} "
                  f"WHERE eventType = 75 GROUP BY domainId) dm ON dm.did = x.domainId")
        else:
            dom_name = "'default'"
        types = ", ".join(str(v) for v in NVTX_RANGE_TYPES)
        where = 'x."end" IS NOT NULL' + (f" AND x.eventType IN ({types})" if p.has(src, "eventType") else "")
        # Nesting depth per (thread, domain), computed here per rank (map step, in parallel):
        # a running count of open ranges; at equal times ends come before starts (siblings)
        # and longer ranges open first (parents).
        return (
            f"WITH r AS (SELECT row_number() OVER () AS id, {start} AS s, {end} AS e, "
            f"{_col(p, src, 'x', 'globalTid')} AS tid, {dom} AS dom, {dom_name} AS dname, {text} AS txt "
            f"FROM {t} x{j} WHERE {where}), "
            "ev AS (SELECT id, tid, dom, s AS ts, 1 AS kind, e FROM r "
            "UNION ALL SELECT NULL, tid, dom, e, 0, NULL FROM r), "
            "run AS (SELECT id, sum(CASE WHEN kind = 1 THEN 1 ELSE -1 END) OVER (PARTITION BY tid, dom "
            "ORDER BY ts, kind, e DESC ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) - 1 AS depth "
            "FROM ev) "
            f"SELECT {rank}, r.s, r.e, r.tid, r.dom, r.dname, r.txt, CAST(run.depth AS INTEGER) "
            "FROM r JOIN run ON run.id = r.id"
        )
    if table == "gpu_metrics":
        names = f"{s}TARGET_INFO_GPU_METRICS"
        if not (p.has("TARGET_INFO_GPU_METRICS") and p.has(src, "timestamp") and p.has(src, "metricId")):
            return None
        return (
            f'SELECT {rank}, x."timestamp" + {offset_ns}, CAST(x.typeId % 256 AS INTEGER), m.metricName, '
            f"x.value FROM {s}{src} x JOIN {names} m ON m.typeId = x.typeId AND m.metricId = x.metricId"
        )
    raise KeyError(table)
