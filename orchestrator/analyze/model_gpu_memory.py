"""GPU memory in the report: per rank in use at the window's start, peak and end, growth per
step, the GPU's capacity and headroom (from nsys --cuda-memory-usage=true events, view
`mem_rank` in metrics/sql/63_gpu_memory.sql), the cross-rank spread, a downsampled curve per
rank for the HTML, and allocator calls per step (view `alloc_calls`, from the CUDA API trace,
which every CUDA capture has)."""

from __future__ import annotations

from pydantic import Field

from orchestrator.analyze.model_base import Strict

MEMORY_HINT = ("no GPU memory events in this capture: profile with `nsys profile --cuda-memory-usage=true` "
               "(job spec: profile.cuda_memory_usage: true) to see memory in use per rank and its growth")
BASELINE_NOTE = ("bytes in use = allocations minus frees that nsys recorded on the rank's GPU; memory held "
                 "before the capture began is unknown: each rank's curve starts at the smallest baseline that "
                 "keeps it non-negative (0 when the capture saw every allocation it saw freed). The CUDA context "
                 "itself is never counted.")


class RankMemory(Strict):
    rank: int
    device: int | None = None
    capacity_bytes: int | None = Field(None, description="the GPU's total memory (TARGET_INFO_GPU.totalMemory)")
    baseline_bytes: int | None = Field(None, description="added so that the running sum never goes below 0")
    start_bytes: int | None = Field(None, description="in use at the window's start")
    peak_bytes: int | None = Field(None, description="highest in use inside the window; for a job that did not "
                                   "complete, up to the end of the rank's capture (the step it failed or was "
                                   "stopped in, the allocations that filled the GPU)")
    end_bytes: int | None = Field(None, description="in use at the window's end")
    capture_peak_bytes: int | None = Field(None, description="highest in use over the whole capture")
    headroom_bytes: int | None = Field(None, description="capacity - peak")
    peak_pct: float | None = Field(None, description="peak as a share of capacity")
    growth_bytes_per_step: float | None = Field(
        None, description="least-squares slope of the bytes in use at the start of each selected step")
    growth_r2: float | None = None
    rising_steps: int = Field(0, description="selected steps that started with more in use than the one before")
    steps: int = Field(0, description="selected steps with a memory level")
    steps_to_full: float | None = Field(None, description="(capacity - end) / growth: steps left at this rate")
    allocs: int = Field(0, description="allocation events inside the window")
    frees: int = Field(0, description="free events inside the window")
    alloc_calls_per_step: float | None = Field(None, description="cudaMalloc-family calls per selected iteration")
    free_calls_per_step: float | None = Field(None, description="cudaFree-family calls per selected iteration")
    sync_frees_per_step: float | None = Field(
        None, description="cudaFree/cuMemFree calls per iteration: each waits for the whole device")
    alloc_api_ms_per_step: float | None = Field(None, description="CPU time in those calls per iteration")
    alloc_api_pct: float | None = Field(None, description="CPU time in those calls as a share of the iterations")


class MemoryCurve(Strict):
    rank: int
    bytes: list[int] = Field(description="highest in use per time bucket (MemoryReport.curve_t_ms)")


class MemoryReport(Strict):
    source: str = Field(description="cuda_memory_usage (memory events) or none (allocator calls only)")
    hint: str | None = None
    baseline: str = BASELINE_NOTE
    ranks: list[RankMemory]
    peak_rank: int | None = Field(None, description="the rank with the highest peak in use")
    max_peak_bytes: int | None = None
    min_peak_bytes: int | None = None
    median_peak_bytes: float | None = None
    spread_bytes: int | None = Field(None, description="highest minus lowest peak across ranks")
    curve_t_ms: list[float] = Field(default_factory=list, description="bucket starts, on the report's clock")
    curves: list[MemoryCurve] = Field(default_factory=list, description="at most 16 ranks: the extremes and a sample")

    def rank(self, rank: int) -> RankMemory | None:
        return next((r for r in self.ranks if r.rank == rank), None)
