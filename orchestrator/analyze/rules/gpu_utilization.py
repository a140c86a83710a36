"""GPU metrics where they decide: a GPU that runs compute kernels most of the window while its
SMs are mostly idle (kernels too small or memory-bound)."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding

FIX = ("The GPU runs kernels but most SMs idle: grow the work per kernel (larger batch or sequence, "
       "fewer/fused ops with torch.compile), use tensor-core friendly shapes and dtypes (bf16, multiples "
       "of 8/64), and check memory-bound kernels (DRAM bandwidth) in Nsight Compute.")


@dataclass
class GpuUtilization(Rule):
    kind = "gpu_underutilized"
    reads = ()
    min_compute_share: float = 0.5  # compute kernels run at least this share of the window...
    max_sm_active_pct: float = 30.0  # ...while the SMs are active less than this on average

    def evaluate(self, ctx: Context) -> list[Finding]:
        out = []
        hit = [r for r in ctx.report.ranks if r.sm_active_pct is not None and r.window_ms
               and r.compute_ms >= self.min_compute_share * r.window_ms and r.sm_active_pct < self.max_sm_active_pct]
        if hit:
            # What fuller SMs could save, at most: the compute time the idle SMs stand for.
            cost = max(r.compute_ms * (1 - r.sm_active_pct / 100) for r in hit)
            out.append(finding(
                self.kind, [r.rank for r in hit], "compute kernels leave most SMs idle",
                [f"rank {r.rank}: compute kernels run {round(100 * r.compute_ms / r.window_ms)}% of the window, "
                 f"SMs active {r.sm_active_pct}% on average"
                 + (f", tensor cores {r.tensor_active_pct}%" if r.tensor_active_pct is not None else "")
                 + " (GPU metrics)" for r in hit],
                FIX, cost, pct=max(100 * r.compute_ms * (1 - r.sm_active_pct / 100) / r.window_ms for r in hit)))
        return out


RULE = GpuUtilization()
