"""Pipeline stages with unequal compute: the lighter stages idle waiting for the heaviest."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding
from orchestrator.ranklist import ranges

FIX = ("Re-balance the pipeline: move layers from the slowest stage to the fastest (Megatron "
       "--decoder-first/last-pipeline-num-layers, PiPPy split points), or add microbatches to "
       "shrink the bubble.")


@dataclass
class StageImbalance(Rule):
    kind = "stage_imbalance"
    explains_idle = True
    reads = ()
    min_ratio: float = 1.25  # heaviest / lightest stage compute
    high_ratio: float = 1.5

    def evaluate(self, ctx: Context) -> list[Finding]:
        imb = ctx.report.imbalance
        if not imb or imb.ratio < self.min_ratio:
            return []
        stages = {s.stage: s for s in ctx.report.stages}
        hi, lo = stages[imb.slowest_stage], stages[imb.fastest_stage]
        move = round(100 * (hi.compute_ms - lo.compute_ms) / (2 * hi.compute_ms))
        return [finding(
            self.kind, hi.ranks, f"pipeline stage {hi.stage} is {imb.ratio}x heavier than stage {lo.stage}",
            [f"stage {s.stage} (ranks {ranges(s.ranks)}): compute {s.compute_ms} ms, "
             f"no-compute share (bubble) {s.bubble_pct}%"
             + (f" (theory for {len(stages)} stages, {s.microbatches} microbatches: {s.theory_bubble_pct}%)"
                if s.theory_bubble_pct is not None else "") for s in ctx.report.stages],
            FIX + f" Moving about {move}% of stage {hi.stage}'s compute to stage {lo.stage} evens them.",
            hi.compute_ms - lo.compute_ms, severity="high" if imb.ratio >= self.high_ratio else "medium",
            victims=[r for s in ctx.report.stages if s.stage != hi.stage for r in s.ranks])]


RULE = StageImbalance()
