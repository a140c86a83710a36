"""Build `Report.tables` (the nsys stats tables across ranks) from the analysis views.

The views (metrics/sql/92..99) hold every row in ns; this module picks the rows worth showing
and converts units. Which items: the top ones by their largest per-rank total over every
rank, so an item heavy on one rank only is kept. Which ranks: all of them up to TABLE_RANKS;
past that the rows of the ranks that explain the run (table_ranks), so the report's size and
the analysis's memory stay flat in the number of ranks (every rank's rows remain in the
store's views).
"""

from __future__ import annotations

from typing import Any

from orchestrator.analyze.model_report import Report
from orchestrator.analyze.model_stats_tables import (
    ApiRow,
    GpuSlice,
    KernelRow,
    MemOpRow,
    PhaseRow,
    StatsTables,
    SyncApi,
    SyncCopy,
    ThreadRow,
)
from orchestrator.analyze.rank_pick import by_findings, median_step_rank, pick_ranks
from orchestrator.analyze.units import ms6
from orchestrator.metrics.engine import Options, Views

TOP_PHASES = 40  # range groups
TOP_KERNELS = 25  # kernel names
TOP_CALLS = 20  # call names per api
LOW_UTIL_PCT = 50.0  # nsys gpu-low-util's default threshold
TABLE_RANKS = 64  # ranks whose rows the tables keep, past which they keep the ones that matter


def _dur(r: dict[str, Any]) -> dict[str, Any]:
    return dict(count=int(r["n"]), total_ms=ms6(r["total_ns"]), mean_ms=ms6(r["mean_ns"]),
                median_ms=ms6(r["med_ns"]), min_ms=ms6(r["min_ns"]), max_ms=ms6(r["max_ns"]),
                std_ms=ms6(r["std_ns"]), per_step_ms=ms6(r["per_step_ns"]))


# Each query takes the ranks to keep as its last parameter; a top-N query takes N before them.
# The items of a top-N table: those among the N with the largest per-rank total over every rank
# (per API for the calls), so an item heavy on one rank only is kept; their rows on the ranks.
_PHASES = """
    WITH k AS (SELECT grp AS k, max(total_ns) AS m FROM phase_table GROUP BY ALL),
         t AS (SELECT * FROM (SELECT *, row_number() OVER (ORDER BY m DESC, k) AS i FROM k) WHERE i <= ?)
    SELECT x.* FROM phase_table x JOIN t ON x.grp = t.k
    WHERE list_contains(?::INTEGER[], x.rank) ORDER BY x.cpu_median_ns DESC, x.grp, x.rank"""
_KERNELS = """
    WITH k AS (SELECT name AS k, max(total_ns) AS m FROM kernel_table GROUP BY ALL),
         t AS (SELECT * FROM (SELECT *, row_number() OVER (ORDER BY m DESC, k) AS i FROM k) WHERE i <= ?)
    SELECT x.* FROM kernel_table x JOIN t ON x.name = t.k
    WHERE list_contains(?::INTEGER[], x.rank) ORDER BY x.median_total_ns DESC, x.name, x.rank"""
_CALLS = """
    WITH k AS (SELECT api, name AS k, max(total_ns) AS m FROM api_table GROUP BY ALL),
         t AS (SELECT * FROM (SELECT *, row_number() OVER (PARTITION BY api ORDER BY m DESC, k) AS i FROM k)
               WHERE i <= ?)
    SELECT x.* FROM api_table x JOIN t ON x.name = t.k AND x.api = t.api
    WHERE list_contains(?::INTEGER[], x.rank) ORDER BY x.api, x.rank, x.tid NULLS FIRST, x.total_ns DESC, x.name"""
_MEMORY = """SELECT * FROM mem_table WHERE list_contains(?::INTEGER[], rank)
             ORDER BY op, host_kind <> 'all', host_kind, rank"""
_THREADS = "SELECT * FROM thread_table WHERE list_contains(?::INTEGER[], rank) ORDER BY rank, blocked_ns DESC, tid"
_SYNC_COPIES = """SELECT *, CASE WHEN n_steps > 0 THEN n / n_steps END AS ps FROM sync_copies
                  WHERE list_contains(?::INTEGER[], rank) ORDER BY what, rank"""
_SYNC_APIS = """SELECT *, CASE WHEN n_steps > 0 THEN n / n_steps END AS ps FROM sync_api_calls
                WHERE list_contains(?::INTEGER[], rank) ORDER BY name, rank"""
_LOW_UTIL = """SELECT * FROM gpu_slices WHERE util_pct < ? AND list_contains(?::INTEGER[], rank)
               ORDER BY rank, slice"""


def _outlier_ranks(v: Views) -> list[int]:
    """Ranks with a row the tables flag as an outlier, most flagged rows first."""
    return [r["rank"] for r in v.query("""
        SELECT rank FROM (SELECT rank FROM phase_table WHERE cpu_outlier OR gpu_outlier
                          UNION ALL SELECT rank FROM kernel_table WHERE outlier
                          UNION ALL SELECT rank FROM mem_table WHERE outlier)
        GROUP BY rank ORDER BY count(*) DESC, rank""")]


def table_ranks(v: Views, report: Report) -> list[int] | None:
    """None when every rank fits in TABLE_RANKS; else the ranks whose rows the tables keep: those
    the findings name (and three victims each), the rank of median step time, the ranks with
    outlier rows, then an even sample of the rest."""
    have = [r.rank for r in report.ranks]
    if len(have) <= TABLE_RANKS:
        return None
    med = median_step_rank(report)
    first = [*by_findings(report, victims=3), *([(med, "median")] if med is not None else []),
             *((rk, "outlier") for rk in _outlier_ranks(v))]
    return list(pick_ranks(have, first, TABLE_RANKS, fill="even"))


# The NVTX domains of libraries: every named one but orch's (its loop marks are the loop's).
_LIBRARY_DOMAINS = """SELECT DISTINCT domain FROM nvtx
                      WHERE domain_id <> 0 AND domain IS NOT NULL AND domain NOT IN ('orch', 'orch.py')"""
_SOURCE_ORDER = {"loop": 0, "library": 1, "once": 2}


def _sources(rows: list[dict[str, Any]], libraries: list[str]) -> dict[str, str]:
    """Whose each phase is: the loop's first; a library's domain, and set-up that every rank opens
    once in a window of several steps, shown apart."""
    out = {}
    for r in rows:
        grp = r["grp"]
        if any(grp.startswith(d + ":") for d in libraries):
            out[grp] = "library"
        elif r["n"] == 1 and r["per_step_ns"] is not None and out.get(grp, "once") == "once":
            out[grp] = "once"
        else:
            out[grp] = "loop"
    return out


def _phases(v: Views, ranks: list[int]) -> list[PhaseRow]:
    rows = v.query(_PHASES, [TOP_PHASES, ranks])
    source = _sources(rows, [r["domain"] for r in v.query(_LIBRARY_DOMAINS)])
    rows.sort(key=lambda r: _SOURCE_ORDER[source[r["grp"]]])  # stable: the query's order within each
    return [PhaseRow(rank=r["rank"], range=r["grp"], **_dur(r), gpu_ms=ms6(r["gpu_ns"]),
                     gpu_per_step_ms=ms6(r["gpu_per_step_ns"]), gpu_ops=int(r["gpu_ops"]),
                     gpu_span_ms=ms6(r["gpu_span_ns"]), cpu_median_ms=ms6(r["cpu_median_ns"]),
                     gpu_median_ms=ms6(r["gpu_median_ns"]), cpu_outlier=r["cpu_outlier"], gpu_outlier=r["gpu_outlier"],
                     source=source[r["grp"]])
            for r in rows]


def _kernels(v: Views, ranks: list[int]) -> list[KernelRow]:
    return [KernelRow(rank=r["rank"], name=r["name"], short_name=r["short_name"] or r["name"], cls=r["cls"],
                      origin=r["origin"], **_dur(r),
                      pct=round(r["pct"], 3), median_total_ms=ms6(r["median_total_ns"]),
                      min_total_ms=ms6(r["min_total_ns"]), max_total_ms=ms6(r["max_total_ns"]), ranks=r["n_ranks"],
                      outlier=r["outlier"])
            for r in v.query(_KERNELS, [TOP_KERNELS, ranks])]


def _memory(v: Views, ranks: list[int]) -> list[MemOpRow]:
    return [MemOpRow(rank=r["rank"], op=r["op"], host_kind=r["host_kind"], **_dur(r), mb=r["bytes"] / 1e6,
                     mean_mb=r["mean_bytes"] / 1e6, median_mb=r["med_bytes"] / 1e6, min_mb=r["min_bytes"] / 1e6,
                     max_mb=r["max_bytes"] / 1e6, pct=round(r["pct"], 3), median_total_ms=ms6(r["median_total_ns"]),
                     outlier=r["outlier"])
            for r in v.query(_MEMORY, [ranks])]


def _api(v: Views, ranks: list[int]) -> list[ApiRow]:
    return [ApiRow(rank=r["rank"], api=r["api"], name=r["name"], tid=r["tid"], thread=r["thread"], role=r["role"],
                   **_dur(r), pct=round(r["pct"] or 0.0, 3))
            for r in v.query(_CALLS, [TOP_CALLS, ranks])]


def _threads(v: Views, ranks: list[int]) -> list[ThreadRow]:
    return [ThreadRow(rank=r["rank"], tid=r["tid"], thread=r["thread"], role=r["role"], span_ms=ms6(r["span_ns"]),
                      launch_ms=ms6(r["launch_ns"]), sync_ms=ms6(r["sync_ns"]), wait_ms=ms6(r["wait_ns"]),
                      blocked_ms=ms6(r["blocked_ns"]), blocked_per_step_ms=ms6(r["blocked_per_step_ns"]),
                      blocked_pct=None if r["blocked_pct"] is None else round(r["blocked_pct"], 2),
                      launch_pct=None if r["launch_pct"] is None else round(r["launch_pct"], 2), top_wait=r["top_wait"])
            for r in v.query(_THREADS, [ranks])]


def build_tables(v: Views, opts: Options, report: Report) -> StatsTables:
    """The tables of `report`'s ranks (all, or table_ranks' choice past TABLE_RANKS); built after
    the rules, whose findings say which ranks matter."""
    kept = table_ranks(v, report)
    ranks = kept if kept is not None else [r["rank"] for r in v.query("SELECT rank FROM ranks")]
    return StatsTables(
        scope=opts.stats_scope, shown=opts.tables, kept_ranks=kept, phases=_phases(v, ranks),
        kernels=_kernels(v, ranks), memory=_memory(v, ranks), api=_api(v, ranks), threads=_threads(v, ranks),
        sync_copies=[SyncCopy(rank=r["rank"], what=r["what"], count=r["n"], api_ms=ms6(r["api_ns"]),
                              gpu_ms=ms6(r["gpu_ns"]), mb=r["bytes"] / 1e6, per_step=r["ps"], top_api=r["top_api"])
                     for r in v.query(_SYNC_COPIES, [ranks])],
        sync_apis=[SyncApi(rank=r["rank"], name=r["name"], count=r["n"], ms=ms6(r["ns"]), max_ms=ms6(r["max_ns"]),
                           per_step=r["ps"])
                   for r in v.query(_SYNC_APIS, [ranks])],
        low_util_slices=[GpuSlice(rank=r["rank"], slice=r["slice"], start_ms=ms6(r["s"]), ms=ms6(r["e"] - r["s"]),
                                  util_pct=round(r["util_pct"], 2))
                         for r in v.query(_LOW_UTIL, [LOW_UTIL_PCT, ranks])],
    )
