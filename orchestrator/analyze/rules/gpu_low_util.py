"""Stretches of the step where the GPU is mostly idle (nsys analyze gpu-low-util), per rank.

The rank's GPU span inside the window is cut into 30 equal slices (view `gpu_slices`); slices
under `max_util_pct` busy are low. The cost is the idle time inside the low slices. It names
WHEN the GPU starves; cpu_gap / data_loader_stall / host_sync say why, so this finding is
capped at `low` when one of those already covers the rank (it runs with the final rules to see them).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from orchestrator.analyze.model import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding, ns_to_ms, worst_first

FIX = ("Find what the CPU does during the low slices (the phase table and the thread view: a blocked "
       "main thread, a data-loading range, a sync) and overlap it with GPU work.")


@dataclass
class GpuLowUtil(Rule):
    kind = "gpu_low_util"
    reads = ("gpu_slices",)
    final = True  # sees the other findings (the ones that say why the GPU idles)
    symptom = True
    max_util_pct: float = 50.0  # nsys's default threshold
    min_slices: int = 3  # of 30: a single slow slice is noise

    def evaluate(self, ctx: Context) -> list[Finding]:
        win = ctx.window_ms()
        low: dict[int, list[dict]] = defaultdict(list)
        for s in ctx.views.rows("gpu_slices"):
            if s["util_pct"] < self.max_util_pct:
                low[s["rank"]].append(s)
        idle = {rk: ns_to_ms(sum((s["e"] - s["s"]) - s["busy_ns"] for s in ss))
                for rk, ss in low.items() if len(ss) >= self.min_slices and win.get(rk)}
        if not idle:
            return []
        worst = max(idle, key=lambda rk: idle[rk] / win[rk])
        from orchestrator.analyze.rules import registry  # the package imports this module

        why = {r.kind for r in registry() if r.explains_idle}
        covered = {rk for f in ctx.findings if f.kind in why for rk in f.ranks}
        pct = 100 * idle[worst] / win[worst]
        return [finding(
            self.kind, idle, f"GPU under {self.max_util_pct:.0f} % busy in {len(low[worst])} of 30 time slices",
            [f"rank {rk}: {len(low[rk])} low slices, GPU idle {idle[rk]} ms in them "
             f"(lowest {min(s['util_pct'] for s in low[rk]):.0f} % busy)"
             for rk, _ in worst_first({k: idle[k] / win[k] for k in idle})],  # the title's rank first
            FIX, idle[worst], pct=pct, severity="low" if set(idle) <= covered and pct >= 1 else None)]


RULE = GpuLowUtil()
