"""Shape the GPU memory views (metrics/sql/63_gpu_memory.sql) into `MemoryReport`: units only
(ns -> ms, sums -> per step), and which ranks' curves the HTML draws."""

from __future__ import annotations

from orchestrator.analyze.model_gpu_memory import MEMORY_HINT, MemoryCurve, MemoryReport, RankMemory
from orchestrator.analyze.rank_pick import pick_ranks
from orchestrator.analyze.units import ms
from orchestrator.metrics.engine import Views

MAX_CURVES = 16


def _int(x: float | None) -> int | None:
    return None if x is None else round(x)


def _per(n: float | None, steps: int) -> float | None:
    return None if n is None or not steps else round(n / steps, 3)


def curve_ranks(peaks: dict[int, int], limit: int = MAX_CURVES) -> list[int]:
    """The ranks whose curves are kept (rank_pick.py): the highest and lowest peak, then an even
    sample."""
    order = sorted(peaks, key=lambda r: (-peaks[r], r))
    return list(pick_ranks(sorted(peaks), [(order[0], "highest"), (order[-1], "lowest")] if order else [], limit))


def build_memory(v: Views) -> MemoryReport | None:
    """The memory section, or None when the capture has neither memory events nor CUDA calls."""
    mem = v.by_rank("mem_rank")
    calls = v.by_rank("alloc_calls")
    if not mem and not any(c["n_alloc"] or c["n_free"] for c in calls.values()):
        return None
    ranks = []
    for rk in sorted(set(mem) | set(calls)):
        m, c = mem.get(rk) or {}, calls.get(rk) or {}
        cap, peak = m.get("capacity"), m.get("peak_bytes")
        n = int(c.get("n_steps") or 0)
        ranks.append(RankMemory(
            rank=rk, device=m.get("device"), capacity_bytes=_int(cap), baseline_bytes=_int(m.get("baseline")),
            start_bytes=_int(m.get("start_bytes")), peak_bytes=_int(peak), end_bytes=_int(m.get("end_bytes")),
            capture_peak_bytes=_int(m.get("capture_peak_bytes")), headroom_bytes=_int(m.get("headroom_bytes")),
            peak_pct=round(100 * peak / cap, 2) if cap and peak is not None else None,
            growth_bytes_per_step=None if m.get("growth_per_step") is None else round(m["growth_per_step"], 1),
            growth_r2=None if m.get("growth_r2") is None else round(m["growth_r2"], 4),
            rising_steps=int(m.get("rising_steps") or 0), steps=int(m.get("n_steps") or 0),
            steps_to_full=None if m.get("steps_to_full") is None else round(m["steps_to_full"], 1),
            allocs=int(m.get("n_alloc") or 0), frees=int(m.get("n_free") or 0),
            alloc_calls_per_step=_per(c.get("n_alloc"), n), free_calls_per_step=_per(c.get("n_free"), n),
            sync_frees_per_step=_per(c.get("n_sync_free"), n),
            alloc_api_ms_per_step=None if not n else ms(c["api_ns"] / n),
            alloc_api_pct=round(100 * c["api_ns"] / c["step_ns"], 3) if n and c.get("step_ns") else None,
        ))
    out = MemoryReport(source="cuda_memory_usage" if mem else "none", hint=None if mem else MEMORY_HINT, ranks=ranks)
    spread = v.rows("mem_spread")
    if spread:
        s = spread[0]
        out.peak_rank, out.max_peak_bytes, out.min_peak_bytes = s["peak_rank"], s["max_peak_bytes"], s["min_peak_bytes"]
        out.spread_bytes, out.median_peak_bytes = s["spread_bytes"], float(s["median_peak_bytes"])
        keep = curve_ranks({rk: m["peak_bytes"] for rk, m in mem.items()})
        pts = v.query("SELECT rank, list(level ORDER BY b) AS y FROM mem_curve WHERE list_contains(?, rank) "
                      "GROUP BY rank ORDER BY rank", [keep])
        out.curves = [MemoryCurve(rank=p["rank"], bytes=[int(y) for y in p["y"]]) for p in pts]
        out.curve_t_ms = [ms(t) for t in
                          (r["t"] for r in v.query("SELECT DISTINCT b, t FROM mem_curve ORDER BY b"))]
    return out
