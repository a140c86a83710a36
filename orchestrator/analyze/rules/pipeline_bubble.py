"""Pipeline stages idle (no compute kernel running) for a large share of the step: the bubble.
Waiting in NCCL send/recv counts as bubble: the GPU is "busy" in a kernel that only waits.

The schedule's own bubble, (p-1)/(m+p-1), is the price of the schedule (fixed by more
microbatches or another schedule); the excess above it is lost to something else, and the
critical path (59_critical_path.sql) names the rank whose work made it. The finding costs the
excess when the microbatch count is known (the theoretical part is a design choice, not a
fault), the whole bubble otherwise. Where the stages send and receive through NCCL kernels,
those kernels span each wait for the peer stage: the excess is then at most the stage's peer
wait above theory, since GPU idle outside them (launch gaps, host work) is no bubble that more
microbatches or another schedule would remove (launch_bound and cpu_gap speak for it).
A final rule: when the stages wait for a peer stage whose GPU idles for its input (a
data_loader_stall finding on another stage's ranks costing at least half as much), the
bubble is that stall seen from downstream, and its finding says so alone. Where the excess
comes from a root rank that has a straggler finding, that finding costs what fixing the root
saves, the bubble's excess included: the bubble costs only what exceeds it (one delay is
counted once), and is info when nothing does. Where the job was replayed with its stages evened
(61_replay.sql), the excess costs what that replay saves, which sees the transfers and unequal
forward and backward costs the formula's theory leaves out; a rank's delays are its straggler
finding's (its own what-if), and a saving within the replay's error is `info`. Not where ranks
of the stages were not profiled: the replay has none of their work, and the excess may be theirs."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from orchestrator.analyze.model_replay import BALANCED
from orchestrator.analyze.model_report import Finding, StageMetrics
from orchestrator.analyze.rules.base import Context, Rule, finding
from orchestrator.analyze.units import ms
from orchestrator.ranklist import ranges

FIX = ("Shrink the pipeline bubble: more microbatches per step (the bubble is (p-1)/(m+p-1) for "
       "GPipe/1F1B with p stages and m microbatches), an interleaved or zero-bubble schedule "
       "(torch.distributed.pipelining ScheduleInterleaved1F1B / ScheduleInterleavedZeroBubble, Megatron "
       "--num-layers-per-virtual-pipeline-stage), and stages of equal cost.")
UNPROFILED_FIX = ("Profile every rank of the stages (profile.ranks: all) to find the rank the excess comes from; "
                  "fix that first.")
HELD_FIX = ("The excess comes from rank(s) {ranks}, not profiled, which hold up the profiled ranks in their "
            "collectives (see that finding): profile them and fix that first.")
ROOT_FIX = ("The excess over the schedule's bubble comes from rank {rk} (`{phase}`): fix that first (see the "
            "straggler finding); more microbatches only shrink the theoretical part.")


@dataclass
class PipelineBubble(Rule):
    kind = "pipeline_bubble"
    explains_idle = True
    final = True  # sees the data_loader_stall findings that explain a peer wait
    reads = ("stage_metrics", "cp_roots")
    min_bubble_pct: float = 10.0  # a stage's no-compute share of the window
    # An imbalance above this ratio is the bubble's cause: stage_imbalance reports it instead.
    imbalance_ratio: float = 1.25
    # Excess below this many points over theory is the schedule's own bubble plus noise.
    min_excess_pct: float = 5.0

    def evaluate(self, ctx: Context) -> list[Finding]:
        stages = ctx.report.stages
        if len(stages) < 2 or (ctx.report.imbalance and ctx.report.imbalance.ratio >= self.imbalance_ratio):
            return []
        hit = [s for s in stages if s.bubble_pct >= self.min_bubble_pct]
        theory = stages[0].theory_bubble_pct
        peer = any(s.peer_wait_pct for s in stages)  # NCCL p2p kernels: they span the peer waits
        if theory is not None:
            hit = [s for s in hit if self._excess(s, peer) >= self.min_excess_pct]
        if not hit:
            return []
        rows = {r["stage"]: r for r in ctx.views.rows("stage_metrics")}
        evidence = []
        for s in stages:
            wait_ms = ms(rows[s.stage]["p2p_wait_ns"])
            split = (f" = {theory}% theory + {s.excess_bubble_pct}% excess" if theory is not None else "")
            evidence.append(f"stage {s.stage} (ranks {ranges(s.ranks)}): no compute kernel running {s.bubble_pct}% of "
                            f"the window{split}; {wait_ms} ms of it in send/recv kernels waiting for the peer stage"
                            + (f" ({s.peer_wait_pct}% of the window)" if peer else ""))
        if theory is not None:
            row = rows[stages[0].stage]
            src = row.get("microbatches_from")
            hint = "; set layout.microbatches to state it" if row.get("microbatches_counted") else ""
            evidence.append(f"theory for {len(stages)} stages and {stages[0].microbatches} microbatches"
                            + (f" ({src}{hint})" if src else "")
                            + f": (p-1)/(m+p-1) = {theory}% (the schedule's own bubble)")
            evidence.append(self._more_microbatches(len(stages), theory, ms(rows[stages[0].stage]["window_ns"], 6)))
        else:
            evidence.append("microbatch count unknown (set layout.microbatches in the job spec, or pass "
                            "--microbatches M, to split the schedule's bubble from the excess)")
        worst = max(hit, key=lambda s: self._excess(s, peer) if theory is not None else s.bubble_pct)
        lost = self._excess(worst, peer) if theory is not None else worst.bubble_pct
        if theory is not None and peer and lost < (worst.excess_bubble_pct or 0.0):
            evidence.append(f"of stage {worst.stage}'s excess, {lost}% is waiting for the peer stage above theory; "
                            "the rest is GPU idle outside send/recv (launch gaps, host work), not the pipeline's")
        cost = (lost or 0.0) / 100 * ms(rows[worst.stage]["window_ns"], 6)
        if theory is not None and peer and self._upstream_stall(ctx, worst, cost):
            return []
        fix, root, unprofiled = FIX, self._root(ctx), ctx.unprofiled()
        if root and unprofiled:  # the path crosses only the profiled ranks: its root may be a victim
            rk, phase, created, n = root
            evidence.append(f"among the profiled ranks the critical path starts at rank {rk} ({n} steps, {created} ms "
                            f"while in `{phase}`), but ranks {ranges(unprofiled)} were not profiled: a rank that waits "
                            "for one of them in a collective looks busy here, and the excess may be theirs")
            fix, root = UNPROFILED_FIX + " " + FIX, None
        elif root:
            rk, phase, created, n = root
            evidence.append(f"the excess comes from rank {rk}: the root of the critical path in {n} steps, "
                            f"{created} ms put on it while in `{phase}`")
            fix = ROOT_FIX.format(rk=rk, phase=phase) + " " + FIX
        what = f"{lost}% above the schedule's {theory}%" if theory is not None else \
            f"{min(s.bubble_pct for s in hit)}-{worst.bubble_pct}%"
        title = f"pipeline bubble: stages idle {what} of the step" + (f" (from rank {root[0]})" if root else "")
        ranks = [r for s in hit for r in s.ranks]
        replay = ctx.report.replay
        balanced = replay.removed(BALANCED) if replay and theory is not None else None
        if replay and balanced and not unprofiled:  # (the replay has no node of an unprofiled rank)
            left = max(balanced.saving_ms, 0.0)
            claimed = self._claimed(ctx, root[0]) if root else None
            evidence.append(f"replayed with every stage's GPU work and CPU time at the stages' mean, the "
                            f"{balanced.steps} steps take {balanced.change}: what unequal stages add to the "
                            "bubble; the rest is the schedule's own with these transfers and these forward and "
                            "backward costs, which more microbatches or an interleaved or zero-bubble schedule shrink"
                            + (f"; rank {root[0]}'s delays are costed by its straggler finding ({claimed.cost_ms} ms)"
                               if claimed else ""))
            info = left <= replay.error_ms
            if info:
                evidence.append(f"that saving is within the replay's error ({replay.error_ms} ms): nothing here is "
                                "beyond the schedule's own bubble")
            # The replay evens every stage: the finding speaks for every stage's wait, the
            # schedule's own included (gpu_low_util defers to it there).
            ranks = [r for s in stages for r in s.ranks]
            return [finding(self.kind, ranks, title, evidence, fix if claimed else FIX, left,
                            pct=max(balanced.saving_pct, 0.0), severity="info" if info else None)]
        held = next((f for f in ctx.findings if f.kind == "unprofiled_straggler" and f.severity != "info"), None)
        if unprofiled and held:
            claim = (f"rank(s) {ranges(held.ranks)}, not profiled, hold up the profiled ranks in their collectives: "
                     f"that finding costs what having them on time saves, {held.cost_ms} ms, this excess included")
            return self._counted(claim, max(cost - held.cost_ms, 0.0), cost, lost, ranks, title, evidence,
                                 HELD_FIX.format(ranks=ranges(held.ranks)) + " " + FIX)
        claimed = self._claimed(ctx, root[0]) if root and theory is not None else None
        if claimed is None:
            return [finding(self.kind, ranks, title, evidence, fix, cost, pct=lost)]
        replayed = ctx.report.what_if(root[0]) is not None
        claim = (f"rank {root[0]}'s straggler finding ({claimed.severity}) costs what the steps would lose with it at "
                 f"its peers' pace, {claimed.cost_ms} ms, this excess included"
                 + (" (the replay's what-if: it measures what fixing the root saves, which this share of the window "
                    "only estimates)" if replayed else ""))
        return self._counted(claim, 0.0 if replayed else max(cost - claimed.cost_ms, 0.0), cost, lost, ranks, title,
                             evidence, fix)

    def _counted(self, claim: str, left: float, cost: float, lost: float, ranks: list[int], title: str,
                 evidence: list[str], fix: str) -> list[Finding]:
        """The bubble where another finding (`claim` says which) costs its excess: only the
        `left` ms beyond that finding's, at the excess's share of the window for them; info when
        nothing is left, so one delay is counted once."""
        beyond = f"; {round(left, 3)} ms of the excess is beyond it" if left else ": it is counted there"
        pct = round(lost * left / cost, 2) if cost else 0.0
        return [finding(self.kind, ranks, title, [*evidence, claim + beyond], fix, left, pct=pct,
                        severity=None if left else "info")]

    @staticmethod
    def _more_microbatches(p: int, theory_pct: float, window_ms: float) -> str:
        """What the schedule's own fix would save: twice the microbatches (v*m from the theory's
        share, b = (p-1)/(v*m+p-1)) at the same compute, the step shrinking by (1-b)/(1-b2)."""
        b = theory_pct / 100
        vm = (p - 1) * (1 / b - 1) if b > 0 else 0.0
        b2 = (p - 1) / (2 * vm + p - 1) if vm else b
        saved = window_ms * (1 - (1 - b) / (1 - b2)) if b2 < 1 else 0.0
        return (f"the schedule's own bubble is a design choice: twice the microbatches would shrink it to "
                f"{round(100 * b2, 2)}%, about {round(saved, 3)} ms of this window at the same compute (an "
                "interleaved or zero-bubble schedule shrinks it too)")

    @staticmethod
    def _claimed(ctx: Context, rank: int) -> Finding | None:
        """The straggler finding that names `rank` as the root, if any."""
        return next((f for f in ctx.findings if f.kind == "straggler" and rank in f.ranks), None)

    @staticmethod
    def _upstream_stall(ctx: Context, worst: StageMetrics, cost_ms: float) -> bool:
        """A data_loader_stall finding on ranks outside the waiting stage, costing at least half
        of the bubble's excess: the peer stage's input, not the pipeline, makes the wait."""
        return any(f.kind == "data_loader_stall" and f.cost_ms >= 0.5 * cost_ms and not set(f.ranks) & set(worst.ranks)
                   for f in ctx.findings)

    @staticmethod
    def _excess(s: StageMetrics, peer: bool) -> float:
        """The stage's bubble above theory that the pipeline causes: with NCCL p2p kernels, at
        most its peer wait above theory."""
        excess = s.excess_bubble_pct or 0.0
        if peer and s.theory_bubble_pct is not None:
            excess = min(excess, round((s.peer_wait_pct or 0.0) - s.theory_bubble_pct, 2))
        return excess

    @staticmethod
    def _root(ctx: Context) -> tuple[int, str, float, int] | None:
        """The rank that put the most excess on the steps' critical paths, with its main phase."""
        by: dict[int, list[dict]] = defaultdict(list)
        for r in ctx.views.rows("cp_roots"):
            by[r["rank"]].append(r)
        if not by:
            return None
        rk, rows = max(by.items(), key=lambda kv: sum(r["created_ns"] for r in kv[1]))
        phases: dict[str, float] = defaultdict(float)
        for r in rows:
            phases[r["phase"] or "GPU compute"] += r["created_ns"]
        phase = max(phases, key=lambda p: phases[p])
        return rk, phase, ms(sum(r["created_ns"] for r in rows)), len(rows)


RULE = PipelineBubble()
