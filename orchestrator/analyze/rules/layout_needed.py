"""Pipeline send/recv seen but no layout given: stages cannot be compared."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding


@dataclass
class LayoutNeeded(Rule):
    kind = "layout_needed"
    reads = ()

    def evaluate(self, ctx: Context) -> list[Finding]:
        hit = [r for r in ctx.report.ranks if r.p2p_ms > 0]
        if ctx.report.layout.get("known") or not hit:
            return []
        return [finding(
            self.kind, [r.rank for r in hit], "pipeline send/recv seen but no layout given",
            [f"rank {r.rank}: {r.p2p_ms} ms in NCCL send/recv kernels" for r in hit],
            "Pass --layout tp=..,pp=..,dp=.. (or set layout in the job spec) to compare pipeline stages.",
            0.0, severity="info")]


RULE = LayoutNeeded()
