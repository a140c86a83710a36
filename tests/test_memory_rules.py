"""The GPU memory rules (memory_growth, memory_near_capacity, allocator_churn) on small
synthetic MemoryReports: what fires, what does not, and the numbers in the evidence, known by
construction. The real captures are in tests/test_gpu_memory.py."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.analyze.model_gpu_memory import MemoryReport, RankMemory
from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules import registry
from tests.rulekit import context, rank

pytestmark = pytest.mark.fast

GIB, MIB = 2**30, 2**20
CAP = 80 * GIB


def _run(kind: str, ctx) -> list[Finding]:
    (rule,) = [r for r in registry() if r.kind == kind]
    return rule.evaluate(ctx)


def _mem(rk: int, **kw: Any) -> RankMemory:
    base: dict[str, Any] = dict(rank=rk, device=0, capacity_bytes=CAP, baseline_bytes=0, start_bytes=10 * GIB,
                                peak_bytes=12 * GIB, end_bytes=10 * GIB, capture_peak_bytes=12 * GIB,
                                headroom_bytes=CAP - 12 * GIB, peak_pct=15.0, growth_bytes_per_step=0.0,
                                growth_r2=1.0, rising_steps=0, steps=20, allocs=0, frees=0,
                                alloc_calls_per_step=0.0, free_calls_per_step=0.0, sync_frees_per_step=0.0,
                                alloc_api_ms_per_step=0.0, alloc_api_pct=0.0)
    base.update(kw)
    return RankMemory(**base)


def _ctx(ranks: list[RankMemory], tables: dict[str, list[dict[str, Any]]] | None = None,
         gaps: dict[int, dict[str, float]] | None = None, **report: Any):
    """A context of these ranks' memory, the analysis views `tables` and each rank's GPU gaps
    >= gap_ms by the range or call they fell in (`gaps`)."""
    peaks = {r.rank: r.peak_bytes or 0 for r in ranks}
    top = max(peaks, key=lambda k: (peaks[k], -k))
    mem = MemoryReport(source="cuda_memory_usage", ranks=ranks, peak_rank=top, max_peak_bytes=max(peaks.values()),
                       min_peak_bytes=min(peaks.values()), spread_bytes=max(peaks.values()) - min(peaks.values()),
                       median_peak_bytes=float(sorted(peaks.values())[len(peaks) // 2]))
    return context([rank(r.rank, gaps_by_range_ms=(gaps or {}).get(r.rank, {})) for r in ranks], tables,
                   memory=mem, **report)


def test_memory_growth_rate_and_steps_left() -> None:
    leak = _mem(1, growth_bytes_per_step=72 * MIB, growth_r2=0.98, rising_steps=19, start_bytes=4 * GIB,
                end_bytes=int(4 * GIB + 19 * 72 * MIB), steps_to_full=(CAP - (4 * GIB + 19 * 72 * MIB)) / (72 * MIB))
    (f,) = _run("memory_growth", _ctx([_mem(0), leak]))
    assert f.ranks == [1] and f.severity == "high"  # (76456 MiB left) / 72 MiB = 1062 steps left: out of memory soon
    assert f.title == "GPU memory grows every step (+72 MiB/step, full in ~1062 steps)"
    assert f.evidence[0].startswith("rank 1: +72.0 MiB per step over 20 steps (R² 0.98, higher than the step before "
                                    "in 19 of 19), 4.00 GiB in use at the window's start, 5.34 GiB at its end")
    assert "~1062 more steps" in f.evidence[0] and ".detach()" in f.fix and ".item()" in f.fix
    timed = _ctx([_mem(0), leak])
    timed.report.ranks[1].median_step_ms = 120.0
    (g,) = _run("memory_growth", timed)
    assert "at this rate (~2.1 min at 120.0 ms/step)" in g.evidence[0]  # 1062 x 0.12 s = 127 s
    # From the window's first step: (CAP - 4 GiB) / 72 MiB = 1081 steps, 19 of them already run.
    assert g.evidence[0].endswith("; from the window's first step, it runs out ~1081 steps into the window")


def test_memory_growth_quiet_when_flat_or_one_jump() -> None:
    assert _run("memory_growth", _ctx([_mem(0), _mem(1)])) == []
    # one jump (an evaluation step allocating 1 GiB once): a slope, but rising in 1 of 19 steps
    jump = _mem(0, growth_bytes_per_step=30 * MIB, growth_r2=0.6, rising_steps=1, steps_to_full=2000.0)
    assert _run("memory_growth", _ctx([jump])) == []
    slow = _mem(0, growth_bytes_per_step=0.5 * MIB, growth_r2=1.0, rising_steps=19, steps_to_full=1e5)
    assert _run("memory_growth", _ctx([slow])) == []
    assert _run("memory_growth", context([rank(0)])) == []  # no memory section at all


def test_memory_near_capacity_names_the_peak_rank_and_spread() -> None:
    ranks = [_mem(0, peak_bytes=int(0.95 * CAP), peak_pct=95.0, headroom_bytes=int(0.05 * CAP)),
             _mem(1, peak_bytes=60 * GIB, peak_pct=75.0), _mem(2, peak_bytes=58 * GIB, peak_pct=72.5)]
    (f,) = _run("memory_near_capacity", _ctx(ranks))
    assert f.ranks == [0] and f.severity == "medium" and "rank 0 (95.0 % at peak)" in f.title
    assert f.evidence[0] == "rank 0: peak 76.00 GiB of 80.00 GiB (95.0 %), headroom 4.00 GiB (at most: the CUDA " \
                            "context is not counted)"
    assert f.evidence[-1] == "highest peak on rank 0; peaks across 3 ranks differ by 18.00 GiB (median 60.00 GiB)"
    assert _run("memory_near_capacity", _ctx([_mem(0), _mem(1)])) == []
    staged = _ctx(ranks)
    staged.report.ranks[0].stage = 0
    (g,) = _run("memory_near_capacity", staged)
    assert g.evidence[-1].startswith("highest peak on rank 0 (pipeline stage 0); peaks across 3 ranks")
    full = _mem(0, peak_bytes=int(0.98 * CAP), peak_pct=98.0)
    assert _run("memory_near_capacity", _ctx([full]))[0].severity == "high"


def test_allocator_churn_cost_and_quiet_loop() -> None:
    churn = _mem(0, alloc_calls_per_step=12.0, free_calls_per_step=12.0, sync_frees_per_step=12.0,
                 alloc_api_ms_per_step=2.5, alloc_api_pct=9.0)
    (f,) = _run("allocator_churn", _ctx([churn, _mem(1)]))
    assert f.ranks == [0] and f.severity == "medium" and f.cost_ms == 9.0  # 9 % of a 100 ms window
    assert f.evidence == ["rank 0: 12.0 allocations + 12.0 frees per step (cudaMalloc/cudaFree family), 2.50 ms of "
                          "CPU per step in them (9.0 % of the iteration); 12.0 cudaFree per step, each waiting for "
                          "the whole device"]
    assert "empty_cache()" in f.fix and "expandable_segments:True" in f.fix
    # the caching allocator's occasional call: under the thresholds
    rare = _mem(0, alloc_calls_per_step=0.3, alloc_api_ms_per_step=0.2, alloc_api_pct=0.15)
    assert _run("allocator_churn", _ctx([rare])) == []
    many_cheap = _mem(0, alloc_calls_per_step=4.0, free_calls_per_step=4.0, alloc_api_pct=0.5)
    assert _run("allocator_churn", _ctx([many_cheap])) == []


def test_allocator_churn_costs_the_gaps_its_calls_fill_and_the_other_rules_leave_them() -> None:
    """Rank 0 churns: 100 GPU gaps its allocator calls fill (30 ms, 80 of them under the gap
    threshold, 8 ms); its other 1,000 short gaps average 20 us, the gap each of those 100 would
    have had anyway: the finding costs 30 - 100 x 0.02 = 28 ms. Its launch gaps leave those 80
    out, and its 12 ms of long gaps in cudaFree are no CPU-gap finding's; rank 1 does not churn,
    and its own gaps in cudaFree are."""
    churn = _mem(0, alloc_calls_per_step=12.0, free_calls_per_step=12.0, sync_frees_per_step=12.0,
                 alloc_api_ms_per_step=2.5, alloc_api_pct=9.0)
    tables = {"alloc_gaps": [{"rank": 0, "n": 100, "ns": 30_000_000, "small_n": 80, "small_ns": 8_000_000},
                             {"rank": 1, "n": 3, "ns": 12_000_000, "small_n": 0, "small_ns": 0}],
              "small_gaps": [{"rank": 0, "n": 1080, "ns": 28_000_000}, {"rank": 1, "n": 10, "ns": 100_000}],
              "kernel_stats": [{"rank": 0, "n": 2000, "median_ns": 8000, "n_steps": 4}],
              "graph_usage": [], "capture_overhead": []}
    gaps = {0: {"loop thread in cudaFree": 12.0}, 1: {"loop thread in cudaFree_v3020": 12.0}}
    ctx = _ctx([churn, _mem(1)], tables, gaps)
    (f,) = _run("allocator_churn", ctx)
    assert f.ranks == [0] and f.cost_ms == 28.0 and f.severity == "high"
    assert f.evidence[-1] == ("rank 0: the GPU waited 28.0 ms for them: 100 gaps they fill at least a quarter of, "
                              "30.0 ms, less the rank's usual launch gap each")
    (lb,) = _run("launch_bound", ctx)
    assert lb.cost_ms == 20.0 and lb.evidence[0].endswith(
        "1000 sub-threshold gaps totalling 20.0 ms (and 80 more, 8.0 ms, that device allocations and frees fill: "
        "the allocator churn finding's)")
    (cpu,) = _run("cpu_gap", ctx)
    assert cpu.ranks == [1] and cpu.cost_ms == 12.0


def test_curves_kept_for_the_extremes_and_a_sample() -> None:
    from orchestrator.analyze.gpu_memory import curve_ranks

    peaks = {rk: (rk * 7919) % 41 for rk in range(40)}  # a permutation of 0..40 without one value
    kept = curve_ranks(peaks)
    top, low = max(peaks, key=lambda r: peaks[r]), min(peaks, key=lambda r: peaks[r])
    assert len(kept) == 16 == len(set(kept)) and top in kept and low in kept and kept == sorted(kept)
    assert curve_ranks({3: 1, 5: 2}) == [3, 5]
