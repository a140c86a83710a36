"""How a job ended, as the report carries it (`Report.outcome`): built from the run directory
by outcome.py, worded by the `job_outcome` rule."""

from __future__ import annotations

from pydantic import Field

from orchestrator.analyze.model_base import Strict


class RankOutcome(Strict):
    rank: int
    last_step: int | None = Field(None, description="the last step the rank began")
    last_done_step: int | None = Field(None, description="the last step it finished before the job ended")
    open_ranges: list[str] = Field(default_factory=list, description="NVTX ranges it was in when its capture "
                                                                      "ended, outermost first")
    furthest: str | None = Field(None, description="the furthest phase of its last step it began")
    ran_on_s: float | None = Field(None, description="seconds its process went on making calls after its loop's "
                                   "last range ended, where it closed every range itself (a job that ended early)")
    exit: str | None = Field(None, description="how its process ended, in words, where the launcher said")
    exit_grace_s: int | None = Field(None, description="its program finished but its process did not end: orch "
                                     "ended it this long after (profile.exit_grace_s)")
    exit_threads: list[str] = Field(default_factory=list, description="then, where each thread of the program's "
                                    "own that still ran was, `file:line (function)`")
    stack: list[str] = Field(default_factory=list, description="its main thread's Python stack when orch stopped "
                             "it, innermost first (from the stack dump)")


class StackClassOut(Strict):
    """Ranks whose main thread had the same Python stack when it was dumped."""

    count: int
    ranks: list[int]
    frame: str = Field(description="the innermost frame of the program's own code, `file:line (function)`")
    innermost: str = Field("", description="the stack's innermost frame, `folder/file:line (function)`")
    waits: str = Field("", description="what it waited for its peers in (a torch.distributed call, backward, a "
                       "CUDA synchronisation), or empty")
    root: bool = Field(False, description="its ranks are the root the outcome names")


class Outcome(Strict):
    """How the job ended, from its run directory (none for reports orch did not submit)."""

    state: str = Field(description="completed, failed, timed out, hung, cancelled, running or unknown")
    scheduler_state: str = Field(description="the scheduler's word: COMPLETED, FAILED, TIMEOUT, CANCELLED, ...")
    line: str = Field(description="the outcome in one line")
    behind: list[int] = Field(default_factory=list, description="ranks that never reached the step or phase "
                                                                 "the others were waiting in, or never exited")
    never_exited: list[int] = Field(default_factory=list, description="ranks that finished every step the others "
                                    "did and never exited: they closed their ranges and made calls until the stop")
    ranks: list[RankOutcome] = Field(default_factory=list)
    dumps: list[str] = Field(default_factory=list, description="hang evidence beside the reports, relative "
                                                               "to the run directory (stack dumps, Flight Recorder)")
    flight_recorder: list[str] = Field(default_factory=list, description="what PyTorch's Flight Recorder dumps "
                                       "say: ranks that never entered a collective, collectives that differ")
    ran_out: int | None = Field(None, description="the rank that failed first, when it failed on running out of "
                                "GPU memory")
    failed_first: int | None = Field(None, description="the rank that failed first by its own error (not a rank "
                                     "that only lost its peer)")
    failed_how: str = Field("", description="its error in words (the launcher's line, its exception)")
    failed_step: int | None = Field(None, description="the step its capture ends in")
    gpu_lost: list[int] = Field(default_factory=list, description="ranks whose GPU trace was lost (no kernel "
                                "kept while they launched GPU work or their peers kept theirs: gpu_lost)")
    root_frame: str | None = Field(None, description="where the root's code was, `file:line (function)`: the "
                                   "collective it called that the others did not, its main thread's frame, or "
                                   "where the rank that failed first raised")
    root_from: str | None = Field(None, description="what named the root: flight_recorder, trace, stacks, or "
                                  "traceback (the rank that failed first, by its own error)")
    stack_classes: list[StackClassOut] = Field(default_factory=list, description="the ranks grouped by their main "
                                               "thread's stack when it was dumped, largest class first")
    torch_oom: str | None = Field(None, description="torch's out-of-memory message of the rank that ran out: what "
                                  "the failing allocation asked for and what the process held")
