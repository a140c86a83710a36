"""A rank that starts collectives last far more often than chance, and what held it up."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model import Finding
from orchestrator.analyze.rules.base import DATA_LOADER_FIX, DATA_RANGE, Context, Rule, finding, ns_to_ms

NO_CAUSE_FIX = ("No CPU-side cause is visible. Compare rank {rk}'s kernel times and GPU clocks with "
                "the others (nvidia-smi -q -d CLOCK,PERFORMANCE: throttling, ECC, PCIe/NVLink), its "
                "input sizes (uneven shards or sequence lengths), and its host (CPU contention, NUMA).")


@dataclass
class Straggler(Rule):
    kind = "straggler"
    reads = ("stragglers", "straggler_context", "late_busy", "rank_metrics")
    # A CPU range is named as the cause when the late rank's GPU idled in it for at least this
    # share of the time the others waited for it.
    cause_share: float = 0.3

    def evaluate(self, ctx: Context) -> list[Finding]:
        out = []
        busy = ctx.views.by_rank("late_busy")
        for s in sorted(ctx.report.stragglers, key=lambda s: -s.wait_caused_ms):
            rk = s.rank
            evidence = [
                f"rank {rk} started last in {s.late_count} of {s.collectives} collectives "
                f"(chance: 1 in {s.group_size}; p={s.p_value:.2g}), median {s.median_lateness_ms} ms late",
                f"the other ranks waited {s.wait_caused_ms} ms for it in NCCL kernels "
                f"({s.share_of_window_pct}% of their window)",
            ]
            victims = [r for r in ctx.report.ranks if r.rank != rk and r.nccl_wait_ms > 0]
            for w in victims:
                share = round(100 * w.nccl_wait_ms / w.comm_ms) if w.comm_ms else 0
                evidence.append(f"rank {w.rank}: {w.nccl_wait_ms} ms of its {w.comm_ms} ms of "
                                f"communication ({share}%) was waiting")
            b = busy.get(rk)
            wait_ms = ns_to_ms(b["wait_ns"]) if b else 0.0
            top = [c for c in ctx.views.rows("straggler_context") if c["rank"] == rk]
            top.sort(key=lambda c: (-c["ns"], c["range_group"]))
            cause = None
            if top and wait_ms and ns_to_ms(top[0]["ns"]) >= self.cause_share * wait_ms:
                cause = top[0]["range_group"]
                idle = ns_to_ms(top[0]["ns"])
                evidence.append(f"while they waited, rank {rk}'s GPU sat idle for {idle} ms "
                                f"({round(100 * idle / wait_ms)}% of the wait) with its CPU in `{cause}`")
            elif b and wait_ms:
                busy_pct = round(100 * ns_to_ms(b["busy_ns"]) / wait_ms)
                evidence.append(f"while they waited, rank {rk}'s GPU was busy {busy_pct}% "
                                "of the time (still running earlier work); no CPU-side range explains the lateness")
            if cause and DATA_RANGE.search(cause):
                fix = f"Rank {rk} is late because its `{cause}` is slow: " + DATA_LOADER_FIX
            elif cause:
                fix = (f"Rank {rk} is late while in `{cause}`: make that range faster on rank {rk} "
                       "or move it off the step.")
            else:
                fix = NO_CAUSE_FIX.format(rk=rk)
            out.append(finding(self.kind, [rk], f"rank {rk} is a straggler" + (f" (in `{cause}`)" if cause else ""),
                               evidence, fix, s.wait_caused_ms, pct=s.share_of_window_pct,
                               victims=[w.rank for w in victims]))
        return out


RULE = Straggler()
