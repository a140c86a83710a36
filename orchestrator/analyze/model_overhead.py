"""What the capture itself cost each rank, estimated (view `capture_overhead`,
metrics/sql/67_capture_overhead.sql): nsys's per-call cost inflates every step time a CPU-bound
loop shows, so a reader must know how much of what they see is the profiler before acting on
it (docs/capture_overhead.md: the method, its calibration and its error)."""

from __future__ import annotations

from pydantic import Field

from orchestrator.analyze.model_base import Strict


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
