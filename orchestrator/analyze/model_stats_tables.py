"""The `nsys stats` / `nsys analyze` tables across ranks, as typed models (Report.tables).

One row per rank and item, so that 8 or 800 ranks read side by side; the cross-rank columns
(`*_median_*`, `outlier`) say which rank stands out. Times are ms with ns precision (6
decimals): the tables are checked against NVIDIA's own `nsys stats` numbers, in ns.
Definitions: metrics/sql/21_stats_scope.sql (scope, cross-rank comparison) and
92_phases.sql .. 99_nsys_rules.sql (one header per table).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.analyze.model_base import Strict


class _Durations(Strict):
    """nsys's summary columns (count, total, mean, median, min, max) plus per step."""

    count: int
    total_ms: float
    mean_ms: float
    median_ms: float
    min_ms: float
    max_ms: float
    std_ms: float = Field(description="sample standard deviation, as nsys's StdDev")
    per_step_ms: float | None = Field(None, description="total / selected steps (None without steps)")


class PhaseRow(_Durations):
    rank: int
    range: str = Field(description="NVTX range group (range_group; `DOMAIN:` prefix outside the default domain)")
    gpu_ms: float = Field(description="GPU time projected onto the range: union of the GPU ops whose CUDA "
                                      "launch started inside one of its instances on the same thread")
    gpu_per_step_ms: float | None = None
    gpu_ops: int = Field(description="GPU ops launched inside the instances (nvtxgpuproj NumGPUOps, summed)")
    gpu_span_ms: float = Field(description="sum over instances of [first op start, last op end] "
                                           "(nvtxgpuproj's projected duration)")
    cpu_median_ms: float = Field(description="cross-rank median of per_step_ms (total_ms without steps)")
    gpu_median_ms: float = Field(description="cross-rank median of gpu_per_step_ms (gpu_ms without steps)")
    cpu_outlier: bool = Field(description="above the other ranks' median by > 3 MAD, > 10 % and > 1 ms")
    gpu_outlier: bool
    source: Literal["loop", "library", "once"] = Field(
        "loop", description="loop: the program's own ranges (and orch's loop marks); library: a library's NVTX "
        "domain (NCCL, CCCL, ...); once: a range the rank opens once in a window of several steps (set-up)")


class KernelRow(_Durations):
    rank: int
    name: str = Field(description="demangled kernel name (nsys groups by it, and by grid/block)")
    short_name: str
    cls: Literal["compute", "communication", "memory"]
    origin: Literal["generated", "library", "graph"] = Field(
        default="library", description="generated: a Triton kernel torch.compile (Inductor) wrote (triton_*); "
        "library: cuBLAS, cuDNN, ATen, NCCL, ...; graph: one CUDA graph replay (graph-level tracing)")
    pct: float = Field(description="share of the rank's kernel time")
    median_total_ms: float = Field(description="cross-rank median of per_step_ms (total_ms without steps)")
    min_total_ms: float
    max_total_ms: float
    ranks: int = Field(description="ranks that ran this kernel")
    outlier: bool


class MemOpRow(_Durations):
    rank: int
    op: str = Field(description="HtoD, DtoH, DtoD, memset, ... (nsys: `[CUDA memcpy HtoD]`)")
    host_kind: str = Field(description="host memory: pageable / pinned / managed; device; `all` = the op's total")
    mb: float = Field(description="MB moved (10^6 bytes, as nsys)")
    mean_mb: float
    median_mb: float
    min_mb: float
    max_mb: float
    pct: float = Field(description="share of the rank's memory-op time")
    median_total_ms: float
    outlier: bool


class ApiRow(_Durations):
    rank: int
    api: Literal["cuda", "osrt"]
    name: str = Field(description="call name; CUDA names without nsys's `_vNNNN` suffix")
    tid: int | None = Field(None, description="None: all threads (nsys's row); else this thread's share")
    thread: str | None = None
    role: str | None = None
    pct: float = Field(description="share of the rank's time in this api (cuda or osrt), all threads")


class ThreadRow(Strict):
    rank: int
    tid: int
    thread: str = Field(description="thread name as nsys names it, with the OS thread id")
    role: str = Field(description="main / autograd / nccl / cuda / data worker / other")
    span_ms: float
    launch_ms: float = Field(description="in non-blocking CUDA calls (launches, async copies)")
    sync_ms: float = Field(description="in blocking CUDA calls (synchronize, cudaMemcpy)")
    wait_ms: float = Field(description="in blocking OS calls (pthread_cond_wait, poll, ...)")
    blocked_ms: float = Field(description="union of sync and wait time")
    blocked_per_step_ms: float | None = None
    blocked_pct: float | None = None
    launch_pct: float | None = None
    top_wait: str | None = Field(None, description="the blocking call it spent most time in")


class SyncCopy(Strict):
    rank: int
    what: Literal["memcpy", "memset"]
    count: int
    api_ms: float = Field(description="CPU time blocked in the calls")
    gpu_ms: float
    mb: float
    per_step: float | None = None
    top_api: str


class SyncApi(Strict):
    rank: int
    name: str
    count: int
    ms: float
    max_ms: float
    per_step: float | None = None


class GpuSlice(Strict):
    rank: int
    slice: int = Field(description="0..29 across the rank's GPU span")
    start_ms: float
    ms: float
    util_pct: float = Field(description="union of GPU ops in the slice / slice length")


class StatsTables(Strict):
    """Per-rank tables side by side (filled by analyze/stats_tables.py)."""

    scope: Literal["window", "capture"] = Field(
        "window", description="window: the selected steps (CPU tables: span of the steps; GPU tables: the "
                              "window); capture: everything, as `nsys stats`")
    shown: Literal["phases", "all"] = Field("phases", description="what the terminal printed (--tables)")
    kept_ranks: list[int] | None = Field(None, description="None: every rank's rows; past 64 ranks, the ranks "
                                         "whose rows are kept (those the findings name and a few victims each, "
                                         "the median-step rank, ranks with outlier rows, an even sample); the "
                                         "store's views hold every rank")
    phases: list[PhaseRow] = Field([])
    kernels: list[KernelRow] = Field([])
    memory: list[MemOpRow] = Field([])
    api: list[ApiRow] = Field([])
    threads: list[ThreadRow] = Field([])
    sync_copies: list[SyncCopy] = Field([])
    sync_apis: list[SyncApi] = Field([])
    low_util_slices: list[GpuSlice] = Field([],
                                            description="GPU slices under 50 % busy (nsys gpu-low-util)")

    def kept_line(self, ranks: int) -> str:
        """One sentence saying whose rows the tables hold, when not every rank's (`ranks`: how many)."""
        if self.kept_ranks is None:
            return ""
        return (f"tables: the rows of {len(self.kept_ranks)} of {ranks:,} ranks (those the findings name, the "
                "median-step rank, ranks with outlier rows, an even sample); medians and extremes here are over "
                "these ranks, the store's views (phase_table, kernel_table, api_table, ...) hold every rank")
