"""No high or medium finding: say so, with how busy the GPUs were."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding


@dataclass
class Healthy(Rule):
    kind = "healthy"
    reads = ()
    final = True
    summarises = True  # runs after every other rule, the final ones too, and reads their findings

    def evaluate(self, ctx: Context) -> list[Finding]:
        if any(f.severity in ("high", "medium") for f in ctx.findings):
            return []
        outcome = ctx.report.outcome
        if outcome is not None and outcome.state not in ("completed", "unknown"):
            return []  # a job that failed, hung or was stopped is never "healthy"
        ranks = ctx.report.ranks
        busy = [100 - r.gpu_idle_pct for r in ranks if r.gpu_busy_ms > 0]
        evidence = (f"GPU busy {min(busy):.1f}-{max(busy):.1f}% of the window across ranks" if busy
                    else "no GPU activity was captured (CPU-only run or CUDA tracing off): GPU metrics "
                         "are empty; only the CPU phases were compared")
        return [finding(self.kind, [r.rank for r in ranks], "no significant bottleneck found", [evidence],
                        "Nothing to fix from this profile.", 0.0, severity="info")]


RULE = Healthy()
