"""Typed critical path of every analysed step (57_wait_graph.sql, 59_critical_path.sql): who
held the step up, doing what, and who only waited. `Report.critical_path` holds one
`CriticalPath` (None without matched collectives or send/recv across ranks).

Times are ms; a segment's s/e are relative to its step's start (the step's earliest GPU work
on any rank), so steps compare at a glance.
"""

from __future__ import annotations

from pydantic import Field

from orchestrator.analyze.model_base import Strict


class PathSegment(Strict):
    """One rank's work on the path, between its previous collective or send/recv and the moment
    the walk left it (someone waited for it there, or the step ended)."""

    rank: int
    s: float
    e: float
    after_wait_for: int | None = Field(None, description="the rank it had waited for just before "
                                                         "(its lateness then came from there); None: it did not wait")
    created_ms: float = Field(description="excess waiting this segment put on the path (others waited for it "
                                          "beyond what they normally wait, minus the lateness it carried in)")


class CriticalStep(Strict):
    step: int
    ms: float = Field(description="the step's span: earliest GPU work of the step on any rank to the last")
    end_rank: int = Field(description="the rank whose work of the step ends last: where the walk back starts")
    root: int | None = Field(None, description="the rank that put the most excess on the path, when that is "
                                               ">= 10 % of the step and >= 1 ms; None: nobody held the step up")
    root_phase: str | None = Field(None, description="what the root did meanwhile: the CPU range its GPU idled "
                                                     "in, `between steps (other work)`, or `GPU compute`")
    root_ms: float = 0.0
    root_share_pct: float = Field(0.0, description="root_ms as a share of the step")
    root_saving_ms: float = Field(0.0, description="what the step would take less with the root at the others' "
                                                   "pace (cp_roots.saving_ns)")
    victims: list[int] = Field(default_factory=list, description="ranks that waited for the root's lateness")
    path: list[PathSegment] = Field(default_factory=list, description="in time order")


class CriticalRoot(Strict):
    rank: int
    steps: int = Field(description="the steps it held up (was their root)")
    total_ms: float = Field(description="the excess it put on the paths of those steps, in all")
    ms_per_held_step: float = Field(description="the excess it put on the path, mean over the steps it held up")
    ms_per_step: float = Field(description="the excess it put on the paths, over all the analysed steps, per step")
    saving_ms: float = Field(0.0, description="what the steps would take less with it at the others' pace: the "
                                              "replay's what-if where the job was replayed, else what the steps it "
                                              "held up would lose; its straggler finding's cost")


class CriticalPath(Strict):
    steps: list[CriticalStep]
    composition_ms: dict[str, float] = Field(
        default_factory=dict, description="what the path is made of over all steps: GPU compute, GPU idle by CPU "
                                          "range, and `other` (transfers, other GPU work, CPU time)")
    composition_pct: dict[str, float] = Field(default_factory=dict, description="composition_ms as shares of the "
                                              "path (%)")
    held_by: list[CriticalRoot] = Field(default_factory=list, description="the ranks that held steps up, the most "
                                        "excess first")
