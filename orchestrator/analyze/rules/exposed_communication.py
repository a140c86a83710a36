"""Collective communication not hidden behind compute, beyond waiting for late ranks and
pipeline send/recv (those are stragglers and the bubble, reported by their own rules). Where
some of the job's ranks were not profiled, a collective's wait for them cannot be told from its
transfer: the finding says so, as info without a cost, and how to split them."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding
from orchestrator.ranklist import ranges

FIX = ("Overlap gradient all-reduce with backward: tune DDP bucket_cap_mb (smaller buckets start "
       "earlier), avoid sync points in backward, consider gradient accumulation with no_sync(), "
       "or FSDP/ZeRO prefetching; check NCCL uses the fast fabric (NCCL_DEBUG=INFO).")

UNPROFILED_FIX = ("Profile every rank of a communicator group (profile.ranks: all, or whole groups) to split the "
                  "collectives' time into waiting for late ranks and transfer; then " + FIX[0].lower() + FIX[1:])


@dataclass
class ExposedCommunication(Rule):
    kind = "exposed_communication"
    explains_idle = True
    reads = ()
    max_overlap_pct: float = 50.0  # reported only when less than this share of NCCL time overlaps
    min_share: float = 0.1  # exposed transfer (not waiting, not p2p) as a share of the window

    def evaluate(self, ctx: Context) -> list[Finding]:
        if ctx.report.outcome is not None and ctx.report.outcome.gpu_lost:
            # A rank without kernels leaves its peers' collectives unmatched: their waiting for it
            # cannot be told from transfer, and would all read as exposed communication.
            return []
        hit = {}
        for r in ctx.report.ranks:
            transfer = r.exposed_comm_ms - r.nccl_wait_ms - r.p2p_ms
            if r.comm_ms and r.comm_overlap_pct < self.max_overlap_pct and transfer >= self.min_share * r.window_ms:
                hit[r.rank] = (r, transfer)
        if not hit:
            return []
        evidence = [f"rank {rk}: {r.comm_overlap_pct}% of {r.comm_ms} ms NCCL time overlaps compute; "
                    f"{round(t, 3)} ms exposed beyond waiting for other ranks and pipeline send/recv"
                    for rk, (r, t) in sorted(hit.items())]
        unprofiled = ctx.unprofiled()
        if unprofiled:
            evidence.append(f"ranks {ranges(unprofiled)} were not profiled: the time these ranks' collectives "
                            "waited for them reads as exposed here")
            return [finding(self.kind, hit, "communication not overlapped, or waiting for ranks not profiled",
                            evidence, UNPROFILED_FIX, 0.0, pct=0.0, severity="info")]
        # Overlap hides communication under compute that is not already overlapping it; with
        # little such compute (a collectives benchmark, a model too small for its all-reduce)
        # the fix saves at most that much.
        cost = {rk: min(t, max(0.0, r.compute_ms - r.overlap_ms)) for rk, (r, t) in hit.items()}
        evidence += [f"rank {rk}: only {round(cost[rk], 3)} ms of compute does not already overlap "
                     "communication: at most that much of it can be hidden"
                     for rk, (r, t) in sorted(hit.items()) if cost[rk] < t]
        worst = max(hit, key=lambda rk: cost[rk] / hit[rk][0].window_ms)
        return [finding(self.kind, hit, "communication is not overlapped with compute", evidence,
                        FIX, cost[worst], pct=100 * cost[worst] / hit[worst][0].window_ms)]


RULE = ExposedCommunication()
