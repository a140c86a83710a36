"""Pipeline stages with unequal compute: the lighter stages idle waiting for the heaviest.

Its cost is what balancing the stages saves. A GPipe or 1F1B step takes about (m+p-1) times the
slowest stage's time per microbatch (p stages, m microbatches; (v*m+p-1) interleaved over v
virtual stages), that is 1 / (1 - theory bubble) times the slowest stage's compute per step;
with every stage at the mean compute the step shrinks by that factor times the heaviest stage's
compute above the mean. Without the microbatch count the factor is left at 1 (a lower bound).
Where the job was replayed, what balancing saves is the replay's: the same job with every stage's
GPU work and CPU time at the stages' mean (61_replay.sql), which sees what the formula cannot
(a stage bound by its CPU's launches, the transfers, unequal forward and backward costs); a
saving within the replay's error is `info`."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model_replay import BALANCED
from orchestrator.analyze.model_report import Finding, Severity
from orchestrator.analyze.rules.base import Context, Rule, finding
from orchestrator.analyze.units import ms
from orchestrator.ranklist import ranges

FIX = ("Re-balance the pipeline: move layers from the slowest stage to the fastest (Megatron "
       "--decoder-first/last-pipeline-num-layers, PiPPy split points), or add microbatches to "
       "shrink the bubble.")


@dataclass
class StageImbalance(Rule):
    kind = "stage_imbalance"
    explains_idle = True
    reads = ("stage_metrics",)
    min_ratio: float = 1.25  # heaviest / lightest stage compute
    high_ratio: float = 1.5

    def evaluate(self, ctx: Context) -> list[Finding]:
        imb = ctx.report.imbalance
        if not imb or imb.ratio < self.min_ratio:
            return []
        stages = {s.stage: s for s in ctx.report.stages}
        hi, lo = stages[imb.slowest_stage], stages[imb.fastest_stage]
        mean = sum(s.compute_ms for s in stages.values()) / len(stages)
        move = round(100 * (hi.compute_ms - mean) / hi.compute_ms)
        theory = hi.theory_bubble_pct
        factor = 1.0 / (1.0 - theory / 100) if theory is not None else 1.0
        saving = factor * (hi.compute_ms - mean)
        window = {r["stage"]: ms(r["window_ns"], 6) for r in ctx.views.rows("stage_metrics")}.get(hi.stage)
        evidence = [f"stage {s.stage} (ranks {ranges(s.ranks)}): compute {s.compute_ms} ms, "
                    f"no-compute share (bubble) {s.bubble_pct}%"
                    + (f" (theory for {len(stages)} stages, {s.microbatches} microbatches: {s.theory_bubble_pct}%)"
                       if s.theory_bubble_pct is not None else "") for s in ctx.report.stages]
        replay = ctx.report.replay
        balanced = replay.removed(BALANCED) if replay else None
        # Where the replay gives the saving, the formula stays as a cross-check, said as such: a
        # reader must not see two costs for one finding.
        evidence.append(f"balanced, every stage would compute the mean {round(mean, 3)} ms: the step keeps "
                        + (f"1/(1 - {theory}%) = {round(factor, 3)}x the slowest stage's compute, so "
                           if theory is not None else "at least the slowest stage's compute (microbatch count "
                           "unknown: set layout.microbatches for the schedule's factor), so ")
                        + f"stage {hi.stage}'s {round(hi.compute_ms - mean, 3)} ms above the mean "
                        + (f"would cost {round(saving, 3)} ms by the schedule's formula, from compute alone (the "
                           "replay below gives the saving)" if replay and balanced
                           else f"costs {round(saving, 3)} ms"))
        severity: Severity = "high" if imb.ratio >= self.high_ratio else "medium"
        pct = 100 * saving / window if window else None
        if replay and balanced:
            saving, pct = max(balanced.saving_ms, 0.0), balanced.saving_pct
            evidence.append(f"replayed with every stage's GPU work and CPU time at the stages' mean, the "
                            f"{balanced.steps} steps take {balanced.change}: that is the saving; the "
                            f"replay of the unchanged trace is within {replay.error_pct}% of it")
            if saving <= replay.error_ms:
                evidence.append(f"that saving is within the replay's error ({replay.error_ms} ms): evening the "
                                "stages would not shorten the steps")
                severity = "info"
        return [finding(
            self.kind, hi.ranks, f"pipeline stage {hi.stage} is {imb.ratio}x heavier than stage {lo.stage}",
            evidence, FIX + f" Moving about {move}% of stage {hi.stage}'s compute to the lighter stages evens them.",
            saving, pct=pct, severity=severity,
            victims=[r for s in ctx.report.stages if s.stage != hi.stage for r in s.ranks])]


RULE = StageImbalance()
