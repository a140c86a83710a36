"""Build `Report.tables` (the nsys stats tables across ranks) from the analysis views.

The views (analyze/sql/92..99) hold every row in ns; this module picks the rows worth showing
(top items by cross-rank cost, so 800 ranks stay readable) and converts units. Which items:
chosen by their largest per-rank total, so an item heavy on one rank only is kept.
"""

from __future__ import annotations

from typing import Any

from orchestrator.analyze.engine import Options, Views
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
from orchestrator.analyze.units import ms_or_none

TOP_PHASES = 40  # range groups
TOP_KERNELS = 25  # kernel names
TOP_CALLS = 20  # call names per api
LOW_UTIL_PCT = 50.0  # nsys gpu-low-util's default threshold


def ms(ns: float | int | None) -> float | None:
    """ns -> ms at ns precision: the tables are compared with nsys's ns numbers."""
    return ms_or_none(ns, 6)


def _dur(r: dict[str, Any]) -> dict[str, Any]:
    return dict(count=int(r["n"]), total_ms=ms(r["total_ns"]), mean_ms=ms(r["mean_ns"]), median_ms=ms(r["med_ns"]),
                min_ms=ms(r["min_ns"]), max_ms=ms(r["max_ns"]), std_ms=ms(r["std_ns"]),
                per_step_ms=ms(r["per_step_ns"]))


def _top(v: Views, table: str, key: str, n: int, order: str, where: str = "TRUE",
         part: str = "") -> list[dict[str, Any]]:
    """Rows of `table` whose `key` is among the n with the largest per-rank total_ns (per `part`)."""
    by = f"PARTITION BY {part}" if part else ""
    return v.query(f"""
        WITH k AS (SELECT {part + ', ' if part else ''}{key} AS k, max(total_ns) AS m FROM {table}
                   WHERE {where} GROUP BY ALL),
             t AS (SELECT * FROM (SELECT *, row_number() OVER ({by} ORDER BY m DESC, k) AS i FROM k) WHERE i <= ?)
        SELECT x.* FROM {table} x JOIN t ON x.{key} = t.k {' AND ' + ' AND '.join(f'x.{p} = t.{p}' for p in
                                                          part.split(', ')) if part else ''}
        WHERE {where} ORDER BY {order}""", [n])


def _phases(v: Views) -> list[PhaseRow]:
    return [PhaseRow(rank=r["rank"], range=r["grp"], **_dur(r), gpu_ms=ms(r["gpu_ns"]),
                     gpu_per_step_ms=ms(r["gpu_per_step_ns"]), gpu_ops=int(r["gpu_ops"]),
                     gpu_span_ms=ms(r["gpu_span_ns"]), cpu_median_ms=ms(r["cpu_median_ns"]),
                     gpu_median_ms=ms(r["gpu_median_ns"]), cpu_outlier=r["cpu_outlier"], gpu_outlier=r["gpu_outlier"])
            for r in _top(v, "phase_table", "grp", TOP_PHASES, "x.cpu_median_ns DESC, x.grp, x.rank")]


def _kernels(v: Views) -> list[KernelRow]:
    return [KernelRow(rank=r["rank"], name=r["name"], short_name=r["short_name"] or r["name"], cls=r["cls"],
                      origin=r["origin"], **_dur(r),
                      pct=round(r["pct"], 3), median_total_ms=ms(r["median_total_ns"]),
                      min_total_ms=ms(r["min_total_ns"]), max_total_ms=ms(r["max_total_ns"]), ranks=r["n_ranks"],
                      outlier=r["outlier"])
            for r in _top(v, "kernel_table", "name", TOP_KERNELS, "x.median_total_ns DESC, x.name, x.rank")]


def _memory(v: Views) -> list[MemOpRow]:
    return [MemOpRow(rank=r["rank"], op=r["op"], host_kind=r["host_kind"], **_dur(r), mb=r["bytes"] / 1e6,
                     mean_mb=r["mean_bytes"] / 1e6, median_mb=r["med_bytes"] / 1e6, min_mb=r["min_bytes"] / 1e6,
                     max_mb=r["max_bytes"] / 1e6, pct=round(r["pct"], 3), median_total_ms=ms(r["median_total_ns"]),
                     outlier=r["outlier"])
            for r in v.query("SELECT * FROM mem_table ORDER BY op, host_kind <> 'all', host_kind, rank")]


def _api(v: Views) -> list[ApiRow]:
    return [ApiRow(rank=r["rank"], api=r["api"], name=r["name"], tid=r["tid"], thread=r["thread"], role=r["role"],
                   **_dur(r), pct=round(r["pct"] or 0.0, 3))
            for r in _top(v, "api_table", "name", TOP_CALLS,
                          "x.api, x.rank, x.tid NULLS FIRST, x.total_ns DESC, x.name", part="api")]


def _threads(v: Views) -> list[ThreadRow]:
    return [ThreadRow(rank=r["rank"], tid=r["tid"], thread=r["thread"], role=r["role"], span_ms=ms(r["span_ns"]),
                      launch_ms=ms(r["launch_ns"]), sync_ms=ms(r["sync_ns"]), wait_ms=ms(r["wait_ns"]),
                      blocked_ms=ms(r["blocked_ns"]), blocked_per_step_ms=ms(r["blocked_per_step_ns"]),
                      blocked_pct=None if r["blocked_pct"] is None else round(r["blocked_pct"], 2),
                      launch_pct=None if r["launch_pct"] is None else round(r["launch_pct"], 2), top_wait=r["top_wait"])
            for r in v.query("SELECT * FROM thread_table ORDER BY rank, blocked_ns DESC, tid")]


def build_tables(v: Views, opts: Options) -> StatsTables:
    per_step = "CASE WHEN n_steps > 0 THEN n / n_steps END"
    return StatsTables(
        scope=opts.stats_scope, shown=opts.tables, phases=_phases(v), kernels=_kernels(v), memory=_memory(v),
        api=_api(v), threads=_threads(v),
        sync_copies=[SyncCopy(rank=r["rank"], what=r["what"], count=r["n"], api_ms=ms(r["api_ns"]),
                              gpu_ms=ms(r["gpu_ns"]), mb=r["bytes"] / 1e6, per_step=r["ps"], top_api=r["top_api"])
                     for r in v.query(f"SELECT *, {per_step} AS ps FROM sync_copies ORDER BY what, rank")],
        sync_apis=[SyncApi(rank=r["rank"], name=r["name"], count=r["n"], ms=ms(r["ns"]), max_ms=ms(r["max_ns"]),
                           per_step=r["ps"])
                   for r in v.query(f"SELECT *, {per_step} AS ps FROM sync_api_calls ORDER BY name, rank")],
        low_util_slices=[GpuSlice(rank=r["rank"], slice=r["slice"], start_ms=ms(r["s"]), ms=ms(r["e"] - r["s"]),
                                  util_pct=round(r["util_pct"], 2))
                         for r in v.query("SELECT * FROM gpu_slices WHERE util_pct < ? ORDER BY rank, slice",
                                          [LOW_UTIL_PCT])],
    )
