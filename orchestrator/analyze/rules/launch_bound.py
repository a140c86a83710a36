"""Many tiny kernels separated by launch gaps: the CPU cannot launch fast enough."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding, ns_to_ms

FIX = ("The GPU waits on kernel launches: capture steady-state steps with CUDA graphs "
       "(torch.cuda.graphs / torch.compile(mode='reduce-overhead')), fuse small ops "
       "(torch.compile), or grow the per-kernel work (batch size).")
# A loop that already replays CUDA graphs (graph_usage): what is left is outside them.
FIX_GRAPHS = ("The GPU waits on the kernels launched outside the CUDA graphs this loop already replays: "
              "capture them too (the optimizer step, gradient clipping, loss and metrics), fuse the small "
              "eager ops (torch.compile), or grow the per-kernel work (batch size).")


@dataclass
class LaunchBound(Rule):
    kind = "launch_bound"
    reads = ("kernel_stats", "small_gaps", "graph_usage")
    max_median_ns: int = 20_000  # kernels shorter than this (median) are "tiny"
    min_per_step: int = 200  # kernels per step
    min_share: float = 0.1  # sub-threshold gaps as a share of the window

    def evaluate(self, ctx: Context) -> list[Finding]:
        win = ctx.window_ms()
        small = ctx.views.by_rank("small_gaps")
        hit = []
        for k in ctx.views.rows("kernel_stats"):
            rk, sg = k["rank"], small.get(k["rank"])
            per_step = k["n"] / max(1, k["n_steps"])
            if (sg and win.get(rk) and k["median_ns"] < self.max_median_ns and per_step >= self.min_per_step
                    and ns_to_ms(sg["ns"]) >= self.min_share * win[rk]):
                hit.append((rk, k, sg))
        if not hit:
            return []
        graphs = {r["rank"] for r in ctx.views.rows("graph_usage")} & {x[0] for x in hit}
        return [finding(
            self.kind, [x[0] for x in hit], "many tiny kernels with launch gaps between them",
            [f"rank {rk}: {k['n']} kernels (median {k['median_ns'] / 1e3:.1f} us), "
             f"{sg['n']} sub-threshold gaps totalling {ns_to_ms(sg['ns'])} ms" for rk, k, sg in hit],
            FIX_GRAPHS if graphs else FIX, max(ns_to_ms(sg["ns"]) for _, _, sg in hit),
            pct=max(100 * ns_to_ms(sg["ns"]) / win[rk] for rk, _, sg in hit))]


RULE = LaunchBound()
