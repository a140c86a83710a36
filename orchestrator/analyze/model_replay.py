"""Typed replay of the job (61_replay.sql): how well the graph of the ranks' work and their
synchronisations reproduces each measured step (its error), and what each what-if would save.
`Report.replay` holds one `Replay` (None without matched NCCL work across ranks: a single
GPU, a CPU job). Findings take their saving from the what-ifs; a saving within the replay's
error is no finding above `info`.
"""

from __future__ import annotations

from pydantic import Field

from orchestrator.analyze.model_base import Strict

# The what-ifs that remove a cause from every rank, by their names in 61_replay.sql, in words.
BALANCED, INPUT, SYNCS = "stages balanced", "input on time", "no host syncs"
UNSEEN = "ranks not profiled on time"
LABELS = {BALANCED: "the stages balanced (their GPU work and CPU time at the stages' mean)",
          INPUT: "the input on time (every rank's wait for it removed)",
          SYNCS: "no host syncs (the CPU runs on, the GPU's idle after them gone)",
          UNSEEN: "the ranks not profiled on time (the profiled ranks' excess wait for them removed)"}


class ReplayStep(Strict):
    step: int
    measured_ms: float = Field(description="the step as measured: from the previous step's last synchronisation "
                                           "end (over the ranks) to its own")
    replayed_ms: float = Field(description="the same span as the unchanged replay has it")
    error_pct: float = Field(description="|replayed - measured| as a share of measured")


class WhatIf(Strict):
    what: str = Field(description="the cause removed: `rank <r>` = that rank's own work at its stage peers' "
                                  "median, never slower; `stages balanced` = every pipeline stage's GPU work "
                                  "and CPU time at the stages' mean; `input on time` = every rank's GPU "
                                  "wait for input removed; `no host syncs` = every CPU wait for the "
                                  "GPU's work gone, and the GPU's idle after it; `ranks not profiled on "
                                  "time` = the profiled ranks' wait in collectives with members without a "
                                  "report, above what such waits are on the other profiled ranks, removed")
    rank: int | None = None
    steps: int = Field(description="the analysed steps the what-if was replayed on")
    saving_ms: float = Field(description="the unchanged replay's step ends minus the what-if's, summed")
    saving_pct: float = Field(description="saving_ms as a share of the replayed steps' measured time")
    replayed: bool = Field(True, description="false for a rank that held nobody up (never alone the last to start "
                                             "a synchronisation or to end a step): not replayed, it saves 0")

    @property
    def change(self) -> str:
        """What the what-if does to the steps, in words: `N ms less (P% of their time)`, or more."""
        return (f"{abs(self.saving_ms)} ms {'less' if self.saving_ms >= 0 else 'more'} ({abs(self.saving_pct)}% of "
                "their time)")

    @property
    def label(self) -> str:
        """What was changed, in words, for every renderer."""
        return LABELS.get(self.what, f"{self.what} at its stage peers' pace")


class Replay(Strict):
    steps: list[ReplayStep] = Field(description="the unchanged replay of each analysed step")
    error_ms: float = Field(description="summed |replayed - measured| over the steps")
    error_pct: float = Field(description="error_ms as a share of the steps' measured time")
    worst_step_pct: float = Field(description="the largest step's error_pct")
    forced: int = Field(0, description="synchronisations the replay had to end without all their members "
                                       "(ranks that met them in different orders): the graph's own gaps")
    whatifs: list[WhatIf] = Field(default_factory=list, description="the most saving first")

    def saving(self, rank: int) -> WhatIf | None:
        """The what-if that puts `rank` at its peers' pace, if the rank was tried (replayed, or
        known to save 0: `replayed` says which)."""
        return next((w for w in self.whatifs if w.rank == rank), None)

    def removed(self, what: str) -> WhatIf | None:
        """The what-if that removes cause `what` (BALANCED, INPUT, SYNCS, UNSEEN) from every rank, if
        the job had it to remove (stages to even, a wait for input, a host sync, a wait for ranks
        without a report)."""
        return next((w for w in self.whatifs if w.what == what), None)

    def shown(self) -> list[WhatIf]:
        """The what-ifs that save anything at the report's precision (0.1 ms), the most first."""
        return [w for w in self.whatifs if w.saving_ms >= 0.1]

    @property
    def line(self) -> str:
        """One line for every renderer: how far the replay is from the trace."""
        return (f"replay of the job: {len(self.steps)} step(s) replayed within {self.error_pct:.2f} % of the "
                f"measured time (worst step {self.worst_step_pct:.2f} %)"
                + (f"; {self.forced} synchronisation(s) ended without all their members" if self.forced else ""))
