"""CPU-only captures: a rank whose CPU spends far longer per step in one range than the others.

In synchronous training the other ranks then wait that time out inside their collectives,
which show up as excess in whatever range holds the collective (DDP all-reduces inside
`backward`). So a range that can hold communication can absorb waiting and a data range
cannot: the cause is the largest excess among ranges that cannot absorb waiting (the
largest overall when every excess could be waiting), and the others' excesses are
probable waiting. GPU captures use the gap attribution instead, which sees what the GPU lost.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding
from orchestrator.analyze.units import ms
from orchestrator.metrics.engine import is_input_range

# Ranges that can contain a collective or a wait, so their excess may be waiting for others.
ABSORBS_WAIT = re.compile(r"backward|bwd|all.?reduce|all.?gather|reduce.?scatter|broadcast|barrier|sync|wait|"
                          r"comm|collective|nccl|gloo|send|recv|p2p", re.I)


@dataclass
class CpuPhaseOutlier(Rule):
    kind = "cpu_phase_outlier"
    root = True
    reads = ("cpu_phases", "rank_metrics")
    min_ratio: float = 3.0  # this rank's self time per step vs the others' median
    min_excess_ns: float = 1e6
    min_step_share: float = 0.1  # excess as a share of the rank's CPU step

    def evaluate(self, ctx: Context) -> list[Finding]:
        cpu_only = {r["rank"] for r in ctx.views.rows("rank_metrics") if r["window_source"] == "steps (cpu only)"}
        per: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
        for row in ctx.views.rows("cpu_phases"):
            if row["rank"] in cpu_only:
                per[row["grp"]][row["rank"]] = row
        hot = []  # (excess, grp, rank, row, median of the others)
        slower = []  # every excess in a range that can hold a collective: candidate waiting
        # A range a rank never opens costs it nothing: a range only the slow rank has (an extra
        # evaluation, a hang) is compared with zero on the others, not left without a reference.
        seen = {rk for rows in per.values() for rk in rows}
        for grp, rows in per.items():
            for rk, r in rows.items():
                others = [rows[k]["ns_per_step"] if k in rows else 0.0 for k in seen if k != rk]
                if not others:
                    continue
                med = statistics.median(others)
                excess = r["ns_per_step"] - med
                if (r["ns_per_step"] >= self.min_ratio * med and excess >= self.min_excess_ns
                        and excess >= self.min_step_share * (r["step_ns"] or 0)):
                    hot.append((excess, grp, rk, r, med))
                elif ABSORBS_WAIT.search(grp) and excess >= self.min_excess_ns:
                    slower.append((excess, grp, rk, r, med))
        if not hot:
            return []
        # Ranges that cannot absorb waiting first, then by excess.
        hot.sort(key=lambda h: (bool(ABSORBS_WAIT.search(h[1])) and not is_input_range(h[1]), -h[0], h[1], h[2]))
        grp = hot[0][1]
        causes = [h for h in hot if h[1] == grp]
        cause_ranks = sorted({c[2] for c in causes})
        # The others' waiting shows as excess where their collective sits (DDP: `backward`),
        # hot or not: half the cause's excess there is waiting for it.
        least = min(c[0] for c in causes)
        waits = [h for h in hot + slower if h[1] != grp and h[2] not in cause_ranks
                 and (h in hot or (ABSORBS_WAIT.search(h[1]) and 2 * h[0] >= least))]
        evidence = [f"rank {c[2]}: {ms(c[3]['ns_per_step'])} ms per step in `{grp}` (self time) vs a median "
                    f"of {ms(c[4])} ms on the other ranks ({round(100 * c[3]['ns_per_step'] / c[3]['step_ns'])}% "
                    f"of its {ms(c[3]['step_ns'])} ms CPU step, {c[3]['n_steps']} steps)" for c in causes]
        evidence += [f"rank {w[2]}: `{w[1]}` takes {ms(w[3]['ns_per_step'] - w[4])} ms longer per step than "
                     f"on the others: most likely waiting for rank(s) {', '.join(map(str, cause_ranks))} in a "
                     "collective" for w in waits]
        worst = max(100 * (c[3]["ns_per_step"] - c[4]) / c[3]["step_ns"] for c in causes)
        names = ", ".join(map(str, cause_ranks))
        return [finding(
            self.kind, cause_ranks, f"`{grp}` is slow on rank(s) {names}", evidence,
            f"Rank(s) {names}: " + (ctx.data_loader_fix() if is_input_range(grp) else ctx.cpu_gap_fix()),
            max(ms(c[3]["ns_per_step"] - c[4]) * c[3]["n_steps"] for c in causes), pct=worst,
            victims=[w[2] for w in waits])]


RULE = CpuPhaseOutlier()
