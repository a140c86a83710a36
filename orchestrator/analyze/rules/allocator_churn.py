"""Allocator churn: device memory allocated and freed with CUDA calls inside every step.

From `report.memory` (view `alloc_calls`, metrics/sql/63_gpu_memory.sql): cudaMalloc/cudaFree
family calls per selected iteration and the CPU time in them. PyTorch's caching allocator
reuses its blocks, so a steady loop makes almost none after its first steps; calls every step
mean the cache is emptied (`torch.cuda.empty_cache()` in the loop) or shapes keep changing.
cudaFree also waits for the whole device, so each call stalls the CPU behind the GPU's queue.
The cost is the CPU time in the calls (severity: its share of the iterations).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding

FIX = ("Keep the caching allocator's blocks: remove torch.cuda.empty_cache() (and gc.collect() + empty_cache) "
       "from the training loop; if it was added against fragmentation or out-of-memory, set "
       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True instead. Pad or bucket changing shapes so blocks are "
       "reused; outside PyTorch allocate buffers once, or use cudaMallocAsync with a memory pool.")


@dataclass
class AllocatorChurn(Rule):
    kind = "allocator_churn"
    reads = ()
    min_calls_per_step: float = 2.0  # allocations + frees per iteration
    min_share_pct: float = 1.0  # CPU time in them, of the iterations

    def evaluate(self, ctx: Context) -> list[Finding]:
        mem = ctx.report.memory
        if mem is None:
            return []
        hit = [r for r in mem.ranks
               if r.alloc_api_pct is not None and r.alloc_api_pct >= self.min_share_pct
               and (r.alloc_calls_per_step or 0) + (r.free_calls_per_step or 0) >= self.min_calls_per_step]
        if not hit:
            return []
        hit.sort(key=lambda r: (-(r.alloc_api_pct or 0), r.rank))
        ev = []
        for r in hit[:8]:
            line = (f"rank {r.rank}: {r.alloc_calls_per_step:.1f} allocations + {r.free_calls_per_step:.1f} frees "
                    f"per step (cudaMalloc/cudaFree family), {r.alloc_api_ms_per_step:.2f} ms of CPU per step in them "
                    f"({r.alloc_api_pct:.1f} % of the iteration)")
            if r.sync_frees_per_step:
                line += f"; {r.sync_frees_per_step:.1f} cudaFree per step, each waiting for the whole device"
            ev.append(line)
        if len(hit) > 8:
            ev.append(f"... and {len(hit) - 8} more rank(s)")
        win = ctx.window_ms()
        worst = hit[0]
        cost = (worst.alloc_api_pct or 0) / 100 * win.get(worst.rank, 0.0)
        return [finding(self.kind, [r.rank for r in hit], "memory allocated and freed every step (allocator churn)",
                        ev, FIX, cost, pct=worst.alloc_api_pct)]


RULE = AllocatorChurn()
