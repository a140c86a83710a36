"""Stretches of the step where the GPU is mostly idle (nsys analyze gpu-low-util), per rank.

The rank's GPU span inside the window is cut into 30 equal slices (view `gpu_slices`); slices
under `max_util_pct` busy are low. The finding names WHEN the GPU starves; the causes say why,
and their findings carry what fixing them saves. So this symptom costs only the idle no cause
claims: not the launch gaps under --gap-ms (launch_bound's, view `slice_idle`), not the longer
gaps of a rank that cpu_gap / data_loader_stall / host_sync / a straggler already covers (it runs
with the final rules to see them), and not those in a one-off step (view `slice_oneoff`: the
CUDA-graph recording, a warm-up), which recur in no other step, as the rules that cost idle leave
them out. With nothing left it is `info`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding, graph_eager_steps, worst_first
from orchestrator.analyze.units import ms

FIX = ("Find what the CPU does during the low slices (the phase table and the thread view: a blocked "
       "main thread, a data-loading range, a sync) and overlap it with GPU work.")


ONE_OFF = "one-off (warm-up, graph recording, a one-time initialisation), which no other step repeats"
# A loop that keeps recording CUDA graphs (graph_eager_steps): the idle of its steps that warm up
# or record a new shape's graphs is the cuda_graphs finding's.
RECORDING = ("one-off or in the steps that warm up or record CUDA graphs for new input shapes (the cuda_graphs "
             "finding's)")


@dataclass
class GpuLowUtil(Rule):
    kind = "gpu_low_util"
    reads = ("gpu_slices", "slice_idle", "slice_oneoff", "graph_eager_steps")
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
        low = {rk: ss for rk, ss in low.items() if len(ss) >= self.min_slices and win.get(rk)}
        if not low:
            return []
        split = {(r["rank"], r["slice"]): r for r in ctx.views.rows("slice_idle")}
        idle = {rk: ms(sum((s["e"] - s["s"]) - s["busy_ns"] for s in ss)) for rk, ss in low.items()}
        short, long = ({rk: ms(sum(split.get((rk, s["slice"]), {}).get(col, 0) for s in ss))
                        for rk, ss in low.items()} for col in ("short_ns", "long_ns"))
        once_ns = {(r["rank"], r["slice"]): r["ns"] for r in ctx.views.rows("slice_oneoff")}
        once = {rk: ms(sum(once_ns.get((rk, s["slice"]), 0) for s in ss)) for rk, ss in low.items()}
        from orchestrator.analyze.rules import registry  # the package imports this module

        why = {r.kind for r in registry() if r.explains_idle and r.kind != "launch_bound"}
        recording = set(graph_eager_steps(ctx))
        covered = {rk for f in ctx.findings if f.kind in why for rk in f.ranks}
        unclaimed = {rk: 0.0 if rk in covered else max(long[rk] - once[rk], 0.0) for rk in low}
        worst = max(low, key=lambda rk: idle[rk] / win[rk])
        costly = max(low, key=lambda rk: (unclaimed[rk] / win[rk], -rk))
        pct = 100 * unclaimed[costly] / win[costly]
        gap = f"{ctx.opts.gap_ms:g} ms"
        evidence = [f"rank {rk}: {len(low[rk])} low slices, GPU idle {idle[rk]:.1f} ms in them (lowest "
                    f"{min(s['util_pct'] for s in low[rk]):.0f} % busy): {short[rk]:.1f} ms between kernels under "
                    f"{gap} apart (launch gaps), {long[rk]:.1f} ms in longer gaps"
                    + (", which the cause found on this rank explains" if rk in covered and long[rk] else "")
                    + (f", {once[rk]:.1f} ms of them {ONE_OFF if rk not in recording else RECORDING}: left out of "
                       "the cost" if rk not in covered and once[rk] else "")
                    for rk, _ in worst_first({k: idle[k] / win[k] for k in idle})]  # the title's rank first
        if unclaimed[costly]:
            evidence.append(f"costs what no cause claims: {unclaimed[costly]:.1f} ms of longer gaps on rank {costly}")
        else:
            whose = ("the causes' found on the same ranks" if covered & set(low) else
                     "one-off idle and the CUDA graphs' recording" if recording & set(low) else "one-off idle")
            evidence.append("costs nothing of its own: its launch gaps are the launch-bound finding's"
                            + (f", its longer gaps {whose}" if any(long.values()) else ""))
        return [finding(self.kind, low, f"GPU under {self.max_util_pct:.0f} % busy in {len(low[worst])} of 30 "
                        "time slices", evidence, FIX, unclaimed[costly], pct=pct)]


RULE = GpuLowUtil()
