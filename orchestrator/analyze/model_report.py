"""The report as typed models: the one boundary between analysis and every renderer.

`Report.model_dump_json()` is the JSON orch writes (`--json`), and `docs/report.schema.json`
is generated from these models (`python -m orchestrator.analyze.model_report > docs/report.schema.json`;
a test checks the shipped file matches). Times are ms, percentages 0-100. Renderers
(terminal, HTML, diff) take a `Report`, never a dict, so a renamed field fails loudly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, ValidationError

from orchestrator.analyze.model_base import Strict
from orchestrator.analyze.model_columns import Column, Diff, Html, Terminal, late_of, steady_mean_step, top_gap, waiting
from orchestrator.analyze.model_comm import CommReport
from orchestrator.analyze.model_critical import CriticalPath
from orchestrator.analyze.model_gpu_memory import MemoryReport
from orchestrator.analyze.model_outcome import Outcome
from orchestrator.analyze.model_overhead import CaptureOverhead
from orchestrator.analyze.model_replay import Replay, WhatIf
from orchestrator.analyze.model_stats_tables import StatsTables
from orchestrator.errors import OrchError
from orchestrator.store.loaders import LoaderSettings

SCHEMA_VERSION = 3
Severity = Literal["high", "medium", "low", "info"]
SEVERITY_ORDER: dict[str, int] = {"high": 0, "medium": 1, "low": 2, "info": 3}


class Gap(Strict):
    """One GPU idle gap and the CPU range it is attributed to."""

    start_ms: float
    ms: float
    range: str
    text: str | None = None


class StepTime(Strict):
    step: int
    ms: float
    warmup: bool


class RankMetrics(Strict):
    """Per-rank metrics over the rank's analysis window (view `rank_metrics` and friends)."""

    # Each field declares where it comes from and how the renderers show it (model_columns):
    # a new per-rank metric is its SQL plus one field here.

    rank: Annotated[int, Column(terminal=Terminal("rank", 1, 1, fmt=""), html=Html("rank", 1))]
    host: Annotated[str | None, Column(terminal=Terminal("host", 2, fmt="", left=True), html=Html("host", 2))] = None
    stage: Annotated[int | None, Column(terminal=Terminal("stage", 3, fmt=""), html=Html("stage", 3))] = None
    status: str
    window_ms: Annotated[float, Column(terminal=Terminal("window", 4), html=Html("window ms", 4))]
    compute_ms: Annotated[float, Column(terminal=Terminal("compute", 6, 3), html=Html("compute ms", 6),
                                        diff=Diff(5, True, 0.10, "relative"))] = Field(
        description="union of non-communication kernels")
    comm_ms: Annotated[float, Column(terminal=Terminal("comm", 7), html=Html("comm ms", 7))] = Field(
        description="union of NCCL kernels (collectives and send/recv)")
    overlap_ms: float = Field(description="NCCL time that overlaps compute kernels")
    comm_overlap_pct: Annotated[float, Column(terminal=Terminal("overlap %", 8), html=Html("overlap %", 8),
                                              diff=Diff(3, False, 10.0, "points"))]
    exposed_comm_ms: Annotated[float, Column(terminal=Terminal("exposed comm", 9, 4), html=Html("exposed comm ms", 9),
                                             diff=Diff(4, True, 0.10, "relative"))] = Field(
        description="NCCL time not hidden behind compute")
    gpu_busy_ms: Annotated[float, Column(source="busy_ns")]
    gpu_idle_pct: Annotated[float, Column(terminal=Terminal("GPU idle %", 10, 6), html=Html("GPU idle %", 10),
                                          diff=Diff(1, True, 5.0, "points"))]
    no_compute_pct: Annotated[float, Column(diff=Diff(2, True, 5.0, "points"))] = Field(
        0.0, description="share of the window with no compute kernel: a stage's bubble")
    p2p_ms: float = Field(description="NCCL send/recv share of comm_ms")
    nccl_wait_ms: Annotated[float, Column(terminal=Terminal("waiting", 11, 5, value=waiting),
                                          html=Html("NCCL wait ms", 11), diff=Diff(6, True, 0.25, "relative"))] = Field(
        description="NCCL time spent waiting for the last rank of a collective")
    p2p_wait_ms: Annotated[float, Column(html=Html("p2p wait ms", 12), diff=Diff(7, True, 0.25, "relative"))] = Field(
        0.0, description="send/recv time spent waiting for the peer")
    transfer_ms: float = Field(0.0, description="NCCL kernel time not spent waiting for another rank: moving data")
    exposed_wait_ms: float = Field(0.0, description="exposed NCCL time spent waiting for another rank (the waits, "
                                   "up to exposed_comm_ms)")
    exposed_transfer_ms: float = Field(0.0, description="exposed NCCL time moving data: exposed_comm_ms - "
                                       "exposed_wait_ms")
    other_gpu_ms: float = Field(0.0, description="GPU busy with neither compute nor exposed NCCL time")
    idle_ms: float = Field(0.0, description="GPU idle: window - GPU busy")
    late_count: Annotated[int, Column(terminal=Terminal("late", 12, 7, fmt="", value=late_of), html=Html("late", 13))]
    collectives: Annotated[int, Column(source="n_coll")]
    mean_step_ms: Annotated[float | None, Column(diff=Diff(8, True, 0.05, "relative", missing=steady_mean_step))] = None
    median_step_ms: Annotated[float | None, Column(terminal=Terminal("step", 5, 2), html=Html("median step ms", 5),
                                                   diff=Diff(9, True, 0.05, "relative"))] = None
    p90_step_ms: Annotated[float | None, Column(diff=Diff(10, True, 0.10, "relative"))] = None
    sync_per_step: Annotated[float | None, Column(view="sync_stats", digits=2, terminal=Terminal("syncs/step", 13))] = (
        Field(None, description="host synchronisations per step"))
    sync_idle_ms_per_step: Annotated[float | None, Column(view="sync_stats", source="idle_after_ns_per_step")] = Field(
        None, description="GPU idle right after host syncs, per step")
    sm_active_pct: float | None = Field(None, description="GPU metrics: mean SMs active over the window")
    tensor_active_pct: float | None = Field(None, description="GPU metrics: mean tensor cores active")
    gaps_by_range_ms: Annotated[dict[str, float], Column(view="", terminal=Terminal(
        "top gap range", 14, 8, fmt="", left=True, value=top_gap))]
    top_gaps: Annotated[list[Gap], Column(view="")]
    step_ms: Annotated[list[StepTime], Column(view="")]


class StepRow(Strict):
    step: int
    ms_by_rank: dict[str, float]
    spread_ms: float
    warmup: bool
    complete: bool = Field(True, description="every rank began a step after it: the last step of a rank ends "
                                             "with its range, not at the next step's start")
    oneoff: bool = Field(False, description="a one-off step on some rank: over 3x its median analysed step, and not "
                                            "a pattern (view analysed_steps); left out of the steps' pace")


class StageMetrics(Strict):
    stage: int
    ranks: list[int]
    compute_ms: float
    bubble_pct: float = Field(description="mean share of the window with no compute kernel running")
    gpu_idle_pct: float
    peer_wait_pct: float | None = Field(None, description="share of the window its NCCL send/recv kernels waited "
                                        "for the peer stage (the bubble's part that is the pipeline's)")
    theory_bubble_pct: float | None = Field(None, description="(p-1)/(m+p-1) when microbatches are known")
    microbatches: int | None = None
    excess_bubble_pct: float | None = Field(None, description="bubble_pct above the schedule's theory")


class Imbalance(Strict):
    ratio: float
    slowest_stage: int
    fastest_stage: int


class Straggler(Strict):
    rank: int
    late_count: int
    collectives: int
    group_size: int
    wait_caused_ms: float
    median_lateness_ms: float
    share_of_window_pct: float
    p_value: float


class Problem(Strict):
    rank: int
    status: str
    reason: str | None = None


class CpuPhase(Strict):
    rank: int
    range: str
    ms_per_step: float
    steps: int


class Finding(Strict):
    """One diagnosis: what, where, how sure (evidence), how much it costs and the fix."""

    kind: str
    severity: Severity
    ranks: list[int]
    title: str
    evidence: list[str]
    fix: str
    cost_ms: float = Field(description="the time the analysed steps would save with the cause fixed")
    cost_pct: float | None = Field(None, description="cost_ms as a share of the steps' time the rule measures "
                                                     "against; the severity follows it unless the rule caps it "
                                                     "(a symptom whose cause another finding names), or a low "
                                                     "saving is less than the steps vary by themselves (info); "
                                                     "none for a finding with no measured cost")
    victims: list[int] = Field(default_factory=list, description="ranks that lost time because of `ranks`")
    unprofiled_ms: float | None = Field(None, description="what the fix would save without the profiler, "
                                        "estimated: cost_ms less nsys' own per-call cost in it (capture_overhead), "
                                        "where the cost is GPU idle that traced CUDA calls lengthen; the severity "
                                        "follows it; none where the capture's saving is the fix's")
    unprofiled_err_ms: float | None = Field(None, description="the standard error of unprofiled_ms: nsys' "
                                            "estimated cost's error from its calibration (capture_overhead "
                                            "est_err_ns); a low finding's saving must exceed it together with "
                                            "the steps' own variation to be more than info")


class Window(Strict):
    source: list[str]
    steps: list[int] | None
    gap_ms: float
    note: str
    step_source: str = Field("none", description="where steps came from: NVTX pattern, inferred, or none")
    per_rank: dict[int, list[float]]


class Report(Strict):
    schema_version: int = SCHEMA_VERSION
    orch_version: str
    store: str
    window: Window
    layout: dict[str, int | bool | None]
    ranks: list[RankMetrics]
    steps: list[StepRow]
    stages: list[StageMetrics]
    imbalance: Imbalance | None
    stragglers: list[Straggler]
    missing_ranks: list[int]
    problems: list[Problem]
    cpu_phases: list[CpuPhase]
    gpu_activity: bool
    tables: StatsTables = Field(default_factory=StatsTables, description="nsys stats tables across ranks")
    comm: CommReport | None = Field(None, description="bytes and bandwidth per collective kind, size, group, scope")
    memory: MemoryReport | None = Field(None, description="GPU memory in use per rank, its growth, allocator calls")
    critical_path: CriticalPath | None = Field(None, description="per step: the cross-rank critical path, its root "
                                                                 "and victims (none without matched waits)")
    replay: Replay | None = Field(None, description="the replay of the job: its error per step and overall, and "
                                                    "what each what-if saves (none without matched NCCL work)")
    outcome: Outcome | None = Field(None, description="how the job ended; none for reports orch did not submit")
    capture_overhead: CaptureOverhead | None = Field(None, description="what tracing cost each rank, estimated")
    loaders: dict[int, list[LoaderSettings]] = Field(default_factory=dict, description=(
        "rank -> the settings of each DataLoader it iterated (orch's loop marks; none for reports orch did "
        "not submit)"))
    notes: list[str] = Field(default_factory=list, description="what the reader should know about the capture")
    findings: list[Finding] = Field(default_factory=list)

    def rank(self, rank: int) -> RankMetrics | None:
        return next((r for r in self.ranks if r.rank == rank), None)

    def what_if(self, rank: int) -> WhatIf | None:
        """The replay's what-if that puts `rank` at its stage peers' pace; None where the job was
        not replayed or the rank not tried."""
        return self.replay.saving(rank) if self.replay else None

    def waits_for(self) -> dict[int, list[int]]:
        """Rank -> the ranks it waits for, from the findings that name victims (a straggler, a
        heavy stage). A waiting rank is long wherever it waits (the collective, the step around
        it, a blocking `.item()`), so tables mark its outliers apart from the late rank's."""
        out: dict[int, list[int]] = {}
        for f in self.findings:
            for v in f.victims:
                out.setdefault(v, [])
                out[v] += [r for r in f.ranks if r not in out[v] and r != v]
        return {v: roots for v, roots in out.items() if roots}


def load_report(path: Path) -> Report:
    """A report JSON written by `orch report --json`, or a one-line error saying what it is not."""
    try:
        return Report.model_validate_json(path.read_bytes())
    except OSError as e:
        raise OrchError(f"cannot read {path}: {e.strerror}") from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "top level"
        raise OrchError(f"{path} is not a report written by this orch's `orch report --json` "
                        f"({where}: {first['msg']}); re-run `orch report --json`") from None


def json_schema() -> str:
    return json.dumps(Report.model_json_schema(), indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    print(json_schema(), end="")
