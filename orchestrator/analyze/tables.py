"""Build `Report.tables` (the nsys stats tables across ranks) from the analysis views.

The views (analyze/sql/92..99) hold every row in ns; this module picks the rows worth showing
and converts units. Which items: the top ones by their largest per-rank total over every
rank, so an item heavy on one rank only is kept. Which ranks: all of them up to TABLE_RANKS;
past that the rows of the ranks that explain the run (table_ranks), so the report's size and
the analysis's memory stay flat in the number of ranks (every rank's rows remain in the
store's views).
"""

from __future__ import annotations

from typing import Any

from orchestrator.analyze.engine import Options, Views
from orchestrator.analyze.model import Report
from orchestrator.analyze.model_tables import (
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
from orchestrator.analyze.pick import by_findings, median_step_rank, pick_ranks
from orchestrator.analyze.units import ms_or_none

TOP_PHASES = 40  # range groups
TOP_KERNELS = 25  # kernel names
TOP_CALLS = 20  # call names per api
LOW_UTIL_PCT = 50.0  # nsys gpu-low-util's default threshold
TABLE_RANKS = 64  # ranks whose rows the tables keep, past which they keep the ones that matter


def ms(ns: float | int | None) -> float | None:
    """ns -> ms at ns precision: the tables are compared with nsys's ns numbers."""
    return ms_or_none(ns, 6)


def _dur(r: dict[str, Any]) -> dict[str, Any]:
    return dict(count=int(r["n"]), total_ms=ms(r["total_ns"]), mean_ms=ms(r["mean_ns"]), median_ms=ms(r["med_ns"]),
                min_ms=ms(r["min_ns"]), max_ms=ms(r["max_ns"]), std_ms=ms(r["std_ns"]),
                per_step_ms=ms(r["per_step_ns"]))


def _top(v: Views, table: str, key: str, n: int, order: str, ranks: list[int], part: str = "") -> list[dict[str, Any]]:
    """Rows of `table` on `ranks` whose `key` is among the n with the largest per-rank total_ns
    over every rank (per `part`)."""
    by = f"PARTITION BY {part}" if part else ""
    return v.query(f"""
        WITH k AS (SELECT {part + ', ' if part else ''}{key} AS k, max(total_ns) AS m FROM {table} GROUP BY ALL),
             t AS (SELECT * FROM (SELECT *, row_number() OVER ({by} ORDER BY m DESC, k) AS i FROM k) WHERE i <= ?)
        SELECT x.* FROM {table} x JOIN t ON x.{key} = t.k {' AND ' + ' AND '.join(f'x.{p} = t.{p}' for p in
                                                          part.split(', ')) if part else ''}
        WHERE list_contains(?::INTEGER[], x.rank) ORDER BY {order}""", [n, ranks])


def _on(v: Views, sql: str, ranks: list[int], params: list[Any] | None = None) -> list[dict[str, Any]]:
    """`sql` (a SELECT with `{on}` where the rank filter goes) on `ranks` only."""
    return v.query(sql.format(on="list_contains(?::INTEGER[], rank)"), [*(params or []), ranks])


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


def _phases(v: Views, ranks: list[int]) -> list[PhaseRow]:
    return [PhaseRow(rank=r["rank"], range=r["grp"], **_dur(r), gpu_ms=ms(r["gpu_ns"]),
                     gpu_per_step_ms=ms(r["gpu_per_step_ns"]), gpu_ops=int(r["gpu_ops"]),
                     gpu_span_ms=ms(r["gpu_span_ns"]), cpu_median_ms=ms(r["cpu_median_ns"]),
                     gpu_median_ms=ms(r["gpu_median_ns"]), cpu_outlier=r["cpu_outlier"], gpu_outlier=r["gpu_outlier"])
            for r in _top(v, "phase_table", "grp", TOP_PHASES, "x.cpu_median_ns DESC, x.grp, x.rank", ranks)]


def _kernels(v: Views, ranks: list[int]) -> list[KernelRow]:
    return [KernelRow(rank=r["rank"], name=r["name"], short_name=r["short_name"] or r["name"], cls=r["cls"],
                      origin=r["origin"], **_dur(r),
                      pct=round(r["pct"], 3), median_total_ms=ms(r["median_total_ns"]),
                      min_total_ms=ms(r["min_total_ns"]), max_total_ms=ms(r["max_total_ns"]), ranks=r["n_ranks"],
                      outlier=r["outlier"])
            for r in _top(v, "kernel_table", "name", TOP_KERNELS, "x.median_total_ns DESC, x.name, x.rank", ranks)]


def _memory(v: Views, ranks: list[int]) -> list[MemOpRow]:
    return [MemOpRow(rank=r["rank"], op=r["op"], host_kind=r["host_kind"], **_dur(r), mb=r["bytes"] / 1e6,
                     mean_mb=r["mean_bytes"] / 1e6, median_mb=r["med_bytes"] / 1e6, min_mb=r["min_bytes"] / 1e6,
                     max_mb=r["max_bytes"] / 1e6, pct=round(r["pct"], 3), median_total_ms=ms(r["median_total_ns"]),
                     outlier=r["outlier"])
            for r in _on(v, "SELECT * FROM mem_table WHERE {on} ORDER BY op, host_kind <> 'all', host_kind, rank",
                         ranks)]


def _api(v: Views, ranks: list[int]) -> list[ApiRow]:
    return [ApiRow(rank=r["rank"], api=r["api"], name=r["name"], tid=r["tid"], thread=r["thread"], role=r["role"],
                   **_dur(r), pct=round(r["pct"] or 0.0, 3))
            for r in _top(v, "api_table", "name", TOP_CALLS,
                          "x.api, x.rank, x.tid NULLS FIRST, x.total_ns DESC, x.name", ranks, part="api")]


def _threads(v: Views, ranks: list[int]) -> list[ThreadRow]:
    return [ThreadRow(rank=r["rank"], tid=r["tid"], thread=r["thread"], role=r["role"], span_ms=ms(r["span_ns"]),
                      launch_ms=ms(r["launch_ns"]), sync_ms=ms(r["sync_ns"]), wait_ms=ms(r["wait_ns"]),
                      blocked_ms=ms(r["blocked_ns"]), blocked_per_step_ms=ms(r["blocked_per_step_ns"]),
                      blocked_pct=None if r["blocked_pct"] is None else round(r["blocked_pct"], 2),
                      launch_pct=None if r["launch_pct"] is None else round(r["launch_pct"], 2), top_wait=r["top_wait"])
            for r in _on(v, "SELECT * FROM thread_table WHERE {on} ORDER BY rank, blocked_ns DESC, tid", ranks)]


def build_tables(v: Views, opts: Options, report: Report) -> StatsTables:
    """The tables of `report`'s ranks (all, or table_ranks' choice past TABLE_RANKS); built after
    the rules, whose findings say which ranks matter."""
    kept = table_ranks(v, report)
    ranks = kept if kept is not None else [r["rank"] for r in v.query("SELECT rank FROM ranks")]
    per_step = "CASE WHEN n_steps > 0 THEN n / n_steps END"
    return StatsTables(
        scope=opts.stats_scope, shown=opts.tables, kept_ranks=kept, phases=_phases(v, ranks),
        kernels=_kernels(v, ranks), memory=_memory(v, ranks), api=_api(v, ranks), threads=_threads(v, ranks),
        sync_copies=[SyncCopy(rank=r["rank"], what=r["what"], count=r["n"], api_ms=ms(r["api_ns"]),
                              gpu_ms=ms(r["gpu_ns"]), mb=r["bytes"] / 1e6, per_step=r["ps"], top_api=r["top_api"])
                     for r in _on(v, f"SELECT *, {per_step} AS ps FROM sync_copies WHERE {{on}} ORDER BY what, rank",
                                  ranks)],
        sync_apis=[SyncApi(rank=r["rank"], name=r["name"], count=r["n"], ms=ms(r["ns"]), max_ms=ms(r["max_ns"]),
                           per_step=r["ps"])
                   for r in _on(v, f"SELECT *, {per_step} AS ps FROM sync_api_calls WHERE {{on}} ORDER BY name, rank",
                                ranks)],
        low_util_slices=[GpuSlice(rank=r["rank"], slice=r["slice"], start_ms=ms(r["s"]), ms=ms(r["e"] - r["s"]),
                                  util_pct=round(r["util_pct"], 2))
                         for r in _on(v, "SELECT * FROM gpu_slices WHERE util_pct < ? AND {on} ORDER BY rank, slice",
                                      ranks, [LOW_UTIL_PCT])],
    )
