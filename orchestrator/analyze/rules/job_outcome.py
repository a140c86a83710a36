"""The job did not complete (it failed, hung, timed out or was cancelled): that comes first.

A stopped job's timings describe ranks waiting for a rank that never came; without this
finding the report reads as a slowdown of the waiting ranks. The finding names the ranks
that never reached what the others waited in (a hang), or the first rank to fail and how,
and each rank's last finished step and the ranges it was in when the job ended.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding

_FIX = {
    "hung": "Look at what the ranks behind were doing (their open ranges above, the stack dumps and Flight Recorder "
            "files in the run's dumps/ folder): the other ranks only waited for them.",
    "failed": "Read the failing rank's traceback (`orch status <job>`); the other ranks were stopped after it.",
    "timed out": "The job was still running at its time limit: raise slurm.time or profile fewer steps "
                 "(profile.capture_range).",
    "cancelled": "The job was cancelled: the steps it finished are analysed, the unfinished one is not.",
}


@dataclass
class JobOutcome(Rule):
    kind = "job_outcome"
    reads = ("rank_end",)

    def evaluate(self, ctx: Context) -> list[Finding]:
        o = ctx.report.outcome
        if o is None or o.state in ("completed", "running", "unknown"):
            return []
        evidence = [o.line] + [
            f"rank {r.rank}: last finished step {r.last_done_step if r.last_done_step is not None else 'none'}"
            + (f", in {' > '.join(r.open_ranges)} when its capture ended" if r.open_ranges else "")
            + (f", {r.exit}" if r.exit else "")
            for r in o.ranks] + [f"hang evidence: {d}" for d in o.dumps]
        ranks = o.behind or [r.rank for r in o.ranks if r.exit] or [r.rank for r in o.ranks]
        title = f"the job {o.state} ({o.scheduler_state})" + (
            f": rank(s) {', '.join(map(str, o.behind))} never got as far as the others" if o.behind else "")
        return [finding(self.kind, ranks, title, evidence, _FIX.get(o.state, _FIX["failed"]), 0.0,
                        severity="high")]


RULE = JobOutcome()
