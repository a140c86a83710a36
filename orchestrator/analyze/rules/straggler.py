"""The rank that holds the others up in their collectives, found by following every wait to
its root (56_root_cause.sql): a rank that only arrives late because it was itself waiting
(e.g. for its pipeline input) is a victim, and the blame passes to the rank it waited for."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from orchestrator.analyze.model import Finding
from orchestrator.analyze.model import Straggler as Stats
from orchestrator.analyze.rules.base import (
    BETWEEN_STEPS_WORK,
    DATA_LOADER_FIX,
    DATA_RANGE,
    OTHER_WORK_FIX,
    Context,
    Rule,
    finding,
    ns_to_ms,
)

NO_CAUSE_FIX = ("No CPU-side cause is visible. Compare rank {rk}'s kernel times and GPU clocks with "
                "the others (nvidia-smi -q -d CLOCK,PERFORMANCE: throttling, ECC, PCIe/NVLink), its "
                "input sizes (uneven shards or sequence lengths), and its host (CPU contention, NUMA).")


@dataclass
class Straggler(Rule):
    kind = "straggler"
    reads = ("root_blame", "root_context", "root_busy", "root_cpu", "stragglers", "rank_metrics")
    # A CPU range is named as the cause when the root rank's GPU idled in it for at least this
    # share of the time the others waited for it.
    cause_share: float = 0.3
    # A root reached only through other ranks' waits (not itself statistically late) is
    # reported when the waiting it caused is at least this share of its victims' windows.
    min_indirect_pct: float = 1.0

    def evaluate(self, ctx: Context) -> list[Finding]:
        stats = {s.rank: s for s in ctx.report.stragglers}
        ranks = {r.rank: r for r in ctx.report.ranks}
        busy = ctx.views.by_rank("root_busy")
        out = []
        for b in sorted(ctx.views.rows("root_blame"), key=lambda b: -b["caused_ns"]):
            rk, caused = b["root"], ns_to_ms(b["caused_ns"])
            victims = [ranks[v] for v in b["victims"] if v in ranks]
            denom = sum(v.window_ms for v in victims)
            pct = round(100 * caused / denom, 2) if denom else 0.0
            s = stats.get(rk)
            if s is None and (b["max_hops"] == 0 or pct < self.min_indirect_pct):
                continue
            evidence = self._lateness(rk, s, caused, pct, victims)
            for via in b["vias"] or []:
                vs = stats.get(via)
                late = f"started last in {vs.late_count} of {vs.collectives} collectives, but " if vs else "was late "
                evidence.append(f"rank {via} {late}only because it had itself waited for rank {rk} "
                                "(point-to-point or collective) since its previous collective: a victim, not the cause")
            cause = self._cause(ctx, rk, busy.get(rk), evidence)
            calls = sorted((c for c in ctx.views.rows("root_cpu") if c["rank"] == rk), key=lambda c: -c["ns"])
            b_ms = ns_to_ms(busy[rk]["wait_ns"]) if rk in busy else 0.0
            if calls and b_ms and ns_to_ms(calls[0]["ns"]) >= 0.2 * b_ms:
                evidence.append(f"its loop thread was in `{calls[0]['call']}` for "
                                f"{round(100 * ns_to_ms(calls[0]['ns']) / b_ms)}% of that time (OS runtime trace)")
            if cause == BETWEEN_STEPS_WORK:
                fix = f"Rank {rk} is late because of work it alone does between steps. " + OTHER_WORK_FIX
            elif cause and DATA_RANGE.search(cause):
                fix = f"Rank {rk} is late because its `{cause}` is slow: " + DATA_LOADER_FIX
            elif cause:
                fix = (f"Rank {rk} is late while in `{cause}`: make that range faster on rank {rk} "
                       "or move it off the step.")
            else:
                fix = NO_CAUSE_FIX.format(rk=rk)
            where = f" (in `{cause}`)" if cause else ""
            title = (f"rank {rk} is a straggler{where}" if s else
                     f"rank {rk} holds up rank(s) {', '.join(str(v.rank) for v in victims)}{where}")
            out.append(finding(self.kind, [rk], title, evidence, fix, caused,
                               pct=s.share_of_window_pct if s else pct, victims=[v.rank for v in victims]))
        return out

    @staticmethod
    def _lateness(rk: int, s: Stats | None, caused: float, pct: float, victims: list) -> list[str]:
        ev = []
        if s:
            ev.append(f"rank {rk} started last in {s.late_count} of {s.collectives} collectives "
                      f"(chance: 1 in {s.group_size}; p={s.p_value:.2g}), median {s.median_lateness_ms} ms late")
        ev.append(f"the other ranks waited {caused} ms for it in NCCL kernels ({pct}% of their window)")
        for w in victims:
            if w.nccl_wait_ms > 0:
                share = round(100 * w.nccl_wait_ms / w.comm_ms) if w.comm_ms else 0
                ev.append(f"rank {w.rank}: {w.nccl_wait_ms} ms of its {w.comm_ms} ms of communication "
                          f"({share}%) was waiting")
        return ev

    def _cause(self, ctx: Context, rk: int, b: dict[str, Any] | None, evidence: list[str]) -> str | None:
        wait_ms = ns_to_ms(b["wait_ns"]) if b else 0.0
        top = sorted((c for c in ctx.views.rows("root_context") if c["rank"] == rk),
                     key=lambda c: (-c["ns"], c["range_group"]))
        if top and wait_ms and ns_to_ms(top[0]["ns"]) >= self.cause_share * wait_ms:
            idle = ns_to_ms(top[0]["ns"])
            evidence.append(f"while it fell behind (since its previous collective), rank {rk}'s GPU sat idle for "
                            f"{idle} ms ({round(100 * idle / wait_ms)}% of that time) with its CPU in "
                            f"`{top[0]['range_group']}`")
            return top[0]["range_group"]
        if b and wait_ms:
            busy_pct = round(100 * ns_to_ms(b["busy_ns"]) / wait_ms)
            evidence.append(f"while it fell behind (since its previous collective), rank {rk}'s GPU ran compute "
                            f"{busy_pct}% of the time; no CPU-side range explains the lateness")
        return None


RULE = Straggler()
