"""GPU memory in use grows every step: a leak on its way to out-of-memory.

From `report.memory` (view `mem_rank`, metrics/sql/63_gpu_memory.sql): the least-squares slope
of the bytes in use at the start of each selected step. A steady loop returns to the same
level every step (the caching allocator reuses its blocks), so a slope that is large, steady
(R²) and seen in many steps is memory the loop keeps: tensors that hold their autograd graph
(a loss appended to a list), outputs stored per step, caches that only grow. Severity is how
soon the GPU is full at that rate, not time lost so far (the cost is the job dying later).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding

FIX = ("Find what the loop keeps from each step: a loss or output appended to a list or summed into a "
       "Python total keeps its whole autograd graph alive. Log `loss.item()` (every N steps) or store "
       "`loss.detach()`; keep outputs as `.detach().cpu()` if they are needed; clear caches that grow with the "
       "step (memoisation keyed by step or input); `torch.cuda.memory_snapshot()` / "
       "`torch.cuda.memory._record_memory_history()` name the allocation sites.")

GIB = 2**30


def _gib(b: float | None) -> str:
    return "?" if b is None else f"{b / GIB:.2f} GiB"


@dataclass
class MemoryGrowth(Rule):
    kind = "memory_growth"
    reads = ()
    min_bytes_per_step: float = 1 << 20  # slower growth is noise for a training job
    min_total_bytes: float = 64 << 20  # growth over the selected steps, slope x (steps - 1)
    min_r2: float = 0.5  # steady growth, not one jump (an evaluation, a bigger batch)
    min_rising_share: float = 0.25  # of step-to-step changes that are increases
    min_steps: int = 4
    high_steps_to_full: float = 2_000  # fewer steps left: high
    medium_steps_to_full: float = 20_000

    def evaluate(self, ctx: Context) -> list[Finding]:
        mem = ctx.report.memory
        if mem is None:
            return []
        hit = [r for r in mem.ranks
               if r.growth_bytes_per_step is not None and r.steps >= self.min_steps
               and r.growth_bytes_per_step >= self.min_bytes_per_step
               and r.growth_bytes_per_step * (r.steps - 1) >= self.min_total_bytes
               and (r.growth_r2 or 0) >= self.min_r2
               and r.rising_steps >= self.min_rising_share * (r.steps - 1)]
        if not hit:
            return []
        left = [r.steps_to_full for r in hit if r.steps_to_full is not None]
        soonest = min(left) if left else None
        severity = ("high" if soonest is not None and soonest <= self.high_steps_to_full else
                    "medium" if soonest is not None and soonest <= self.medium_steps_to_full else "low")
        worst = max(hit, key=lambda r: r.growth_bytes_per_step or 0)
        ev = []
        for r in sorted(hit, key=lambda r: -(r.growth_bytes_per_step or 0))[:8]:
            full = (f"; the GPU's {_gib(r.capacity_bytes)} are full in ~{r.steps_to_full:.0f} more steps at this rate"
                    if r.steps_to_full is not None else "")
            rm = ctx.report.rank(r.rank)
            if full and rm is not None and rm.median_step_ms:
                full += f" (~{r.steps_to_full * rm.median_step_ms / 60e3:.1f} min at {rm.median_step_ms:.1f} ms/step)"
            if full and r.capacity_bytes and r.start_bytes is not None and r.growth_bytes_per_step:
                # Told from the window's first step, as it could be before the run ends: when it runs out.
                ahead = (r.capacity_bytes - r.start_bytes) / r.growth_bytes_per_step
                full += f"; from the window's first step, it runs out ~{ahead:.0f} steps into the window"
            ev.append(f"rank {r.rank}: +{(r.growth_bytes_per_step or 0) / 2**20:.1f} MiB per step over {r.steps} steps "
                      f"(R² {r.growth_r2:.2f}, higher than the step before in {r.rising_steps} of {r.steps - 1}), "
                      f"{_gib(r.start_bytes)} in use at the window's start, {_gib(r.end_bytes)} at its end{full}")
        if len(hit) > 8:
            ev.append(f"... and {len(hit) - 8} more rank(s)")
        title = (f"GPU memory grows every step (+{(worst.growth_bytes_per_step or 0) / 2**20:.0f} MiB/step"
                 + (f", full in ~{soonest:.0f} steps)" if soonest is not None else ")"))
        return [finding(self.kind, [r.rank for r in hit], title, ev, FIX, 0.0, severity=severity)]


RULE = MemoryGrowth()
