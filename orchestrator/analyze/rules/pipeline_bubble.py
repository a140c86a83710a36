"""Pipeline stages idle (no compute kernel running) for a large share of the step: the bubble.
Waiting in NCCL send/recv counts as bubble: the GPU is "busy" in a kernel that only waits."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding

FIX = ("Shrink the pipeline bubble: more microbatches per step (the bubble is (p-1)/(m+p-1) for "
       "GPipe/1F1B with p stages and m microbatches), an interleaved or zero-bubble schedule "
       "(torch.distributed.pipelining ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble, Megatron "
       "--num-layers-per-virtual-pipeline-stage), and stages of equal cost.")


@dataclass
class PipelineBubble(Rule):
    kind = "pipeline_bubble"
    reads = ("stage_metrics", "microbatches", "imbalance")
    min_bubble_pct: float = 10.0  # a stage's no-compute share of the window
    # An imbalance above this ratio is the bubble's cause: stage_imbalance reports it instead.
    imbalance_ratio: float = 1.25

    def evaluate(self, ctx: Context) -> list[Finding]:
        stages = ctx.report.stages
        if len(stages) < 2 or (ctx.report.imbalance and ctx.report.imbalance.ratio >= self.imbalance_ratio):
            return []
        hit = [s for s in stages if s.bubble_pct >= self.min_bubble_pct]
        if not hit:
            return []
        rows = {r["stage"]: r for r in ctx.views.rows("stage_metrics")}
        evidence = []
        for s in stages:
            wait_ms = round((rows[s.stage]["p2p_wait_ns"] or 0) / 1e6, 3)
            evidence.append(f"stage {s.stage} (ranks {s.ranks}): no compute kernel running {s.bubble_pct}% of "
                            f"the window; {wait_ms} ms of it in send/recv kernels waiting for the peer stage")
        theory = stages[0].theory_bubble_pct
        if theory is not None:
            evidence.append(f"theory for {len(stages)} stages and {stages[0].microbatches} microbatches: "
                            f"(p-1)/(m+p-1) = {theory}%")
        else:
            evidence.append("microbatch count unknown (pass --microbatches M to compare with theory)")
        worst = max(hit, key=lambda s: s.bubble_pct)
        cost = worst.bubble_pct / 100 * (rows[worst.stage]["window_ns"] or 0) / 1e6
        return [finding(self.kind, [r for s in hit for r in s.ranks],
                        f"pipeline bubble: stages idle {min(s.bubble_pct for s in hit)}-{worst.bubble_pct}% "
                        "of the step", evidence, FIX, cost, pct=worst.bubble_pct)]


RULE = PipelineBubble()
