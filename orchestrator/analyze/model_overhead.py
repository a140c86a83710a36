"""What the capture itself cost each rank, estimated (view `capture_overhead`,
analyze/sql/67_capture_overhead.sql): nsys's per-call cost inflates every step time a CPU-bound
loop shows, so a reader must know how much of what they see is the profiler before acting on
it (docs/capture_overhead.md: the method, its calibration and its error)."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from orchestrator.analyze.model_base import Strict

DISTORTED_PCT = 5.0  # a rank whose estimated overhead passes this share of its window is distorted


class RankOverhead(Strict):
    rank: int
    window_ms: float
    profiler_ms: float = Field(description="nsys's own PROFILER_OVERHEAD time inside the window")
    api_calls: int = Field(description="traced CUDA calls starting in the window (any thread)")
    launches: int = Field(description="kernel and CUDA graph launches among them")
    est_ms: float = Field(description="estimated time the capture added: profiler time + per-call cost, "
                                      "capped by the time the GPU waited between launches")
    share_pct: float = Field(description="est_ms over the window")
    calls_capped: bool = Field(False, description="the per-call cost passed the launch gaps and counts "
                                                  "only up to them")
    distorted: bool = Field(description="share above 5 %, or far above the other ranks'")


class CaptureOverhead(Strict):
    call_ns: int = Field(description="the calibrated cost per traced CUDA call (nsys 2025.3, cuda,nvtx,osrt)")
    ranks: list[RankOverhead]
    line: str = Field(description="the header line; empty when no rank is distorted")

    def worst(self) -> RankOverhead | None:
        return max(self.ranks, key=lambda r: r.share_pct, default=None)


def overhead_line(ranks: list[RankOverhead], call_ns: int) -> str:
    """One sentence for the report's header, naming the worst distorted rank and what its
    estimate is made of (nsys' own recorded time, the per-call cost, or both)."""
    bad = [r for r in ranks if r.distorted]
    if not bad:
        return ""
    w = max(bad, key=lambda r: r.share_pct)
    others = f" ({len(bad) - 1} other rank(s) too)" if len(bad) > 1 else ""
    calls_ms = round(w.est_ms - w.profiler_ms, 3)
    calls = (f"{w.api_calls:,} traced CUDA calls at ~{call_ns / 1000:g} µs each, "
             + (f"capped at the {calls_ms:g} ms of launch gaps" if w.calls_capped else f"{calls_ms:g} ms"))
    parts = ([f"{w.profiler_ms:g} ms of nsys' own PROFILER_OVERHEAD"] if w.profiler_ms else []) + (
        [calls] if calls_ms > 0 else [])
    effect = "step times are inflated, launch gaps partly nsys' own" if calls_ms > 0 else "step times are inflated"
    return (f"capture overhead ≈ {w.share_pct:.0f} % of the window on rank {w.rank}{others} (estimated: "
            f"{' + '.join(parts)}): {effect}")


def build_overhead(v: Any) -> CaptureOverhead | None:
    """From the analysis views (engine.Views); None when no rank had a window."""
    rows = v.rows("capture_overhead")
    if not rows:
        return None
    call_ns = int(v.scalar("SELECT overhead_call_ns()"))
    ranks = [RankOverhead(rank=r["rank"], window_ms=round(r["window_ns"] / 1e6, 3),
                          profiler_ms=round(r["profiler_ns"] / 1e6, 3), api_calls=r["api_calls"],
                          launches=r["launches"], est_ms=round(r["est_ns"] / 1e6, 3),
                          share_pct=round(100 * r["share"], 2), distorted=bool(r["distorted"]),
                          calls_capped=r["api_calls"] * call_ns > r["launch_gap_ns"])
             for r in sorted(rows, key=lambda r: r["rank"])]
    return CaptureOverhead(call_ns=call_ns, ranks=ranks, line=overhead_line(ranks, call_ns))
