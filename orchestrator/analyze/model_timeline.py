"""Typed timeline data beyond the `Report`: per-step times and waiting (the HTML's heatmaps, and
`orch sweep`'s measure of a run), and the aligned cross-rank timeline of two steps (a
representative one and the slowest) the HTML draws, built by analyze/timeline.py in the same
analysis pass as the report.

Times are ms on the store's aligned clock, relative to the shown step's start (`t0`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.analyze.model_base import Strict

SegKind = Literal["compute", "comm transfer", "comm waiting", "other GPU", "sync", "nvtx"]


class Seg(Strict):
    """One drawn interval: ms from the step view's t0; depth only for NVTX ranges."""

    s: float
    e: float
    kind: SegKind
    name: str
    depth: int = 0


class Lane(Strict):
    rank: int
    role: str = Field("", description="root, victim, slowest, fastest or sample: why it is shown")
    cpu: list[Seg] = Field(default_factory=list, description="NVTX ranges of the main (loop) thread")
    syncs: list[Seg] = Field(default_factory=list, description="host syncs (CPU blocked on the GPU)")
    gpu: list[Seg] = Field(default_factory=list, description="kernels, NCCL split into waiting/transfer")


class Edge(Strict):
    """One hop of the root-cause path: `victim` waited during [s, e] for `root` (through `via`)."""

    victim: int
    via: int
    root: int
    s: float
    e: float


class PathSeg(Strict):
    """One rank's work on the step's critical path (59_critical_path.sql), and the excess it put there."""

    rank: int
    s: float
    e: float
    created: float = 0.0


class Hidden(Strict):
    """The ranks not drawn, summarised."""

    n: int
    # GPU compute inside the step's span (the union of compute kernels and graph replays), the
    # median over the ranks not drawn.
    busy_ms_median: float | None = None
    waiting_ms_median: float | None = None
    waiting_ms_max: float | None = None
    waiting_max_rank: int | None = None


class StepView(Strict):
    label: str
    step: int
    t1: float = Field(description="ms from t0 to the end of the last shown rank's step")
    t0_ns: int = Field(description="the view's start on the store clock")
    lanes: list[Lane]
    edges: list[Edge] = Field(default_factory=list, description="the waits on the step's critical path")
    path: list[PathSeg] = Field(default_factory=list, description="the step's critical path, in time order")
    hidden: Hidden | None = None


class Extras(Strict):
    cpu_step_ms: dict[int, dict[int, float]] = Field(
        default_factory=dict, description="rank -> step -> wall time of the step's NVTX range on the loop thread")
    first_step: dict[int, int] = Field(default_factory=dict, description="each rank's first (warm-up) step")
    wait_ms: dict[int, dict[int, float]] = Field(
        default_factory=dict, description="rank -> step -> NCCL waiting for other ranks (analysed steps only)")
    views: list[StepView] = Field(default_factory=list)
    note: str | None = None

