"""Allocator churn: device memory allocated and freed with CUDA calls inside every step.

From `report.memory` (view `alloc_calls`, metrics/sql/40_gaps.sql): cudaMalloc/cudaFree
family calls per selected iteration and the CPU time in them. PyTorch's caching allocator
reuses its blocks, so a steady loop makes almost none after its first steps; calls every step
mean the cache is emptied (`torch.cuda.empty_cache()` in the loop) or shapes keep changing.
cudaFree also waits for the whole device, so each call stalls the CPU behind the GPU's queue.
The cost is what the GPU waited for them (alloc_gaps, 40_gaps.sql): the gaps the calls fill at
least a quarter of, each less the rank's usual launch gap (its other gaps under the gap threshold,
on average), which it would have had without them; the allocator's host work around a call
(finding a block, its bookkeeping) is in that gap too, and the CPU time in the calls alone misses
it. A capture with no GPU gaps (CPU only) is costed by the CPU time in the calls. Those gaps are
then this finding's: launch_bound and cpu_gap leave them out on the ranks it names (one delay
counted once).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model_gpu_memory import RankMemory
from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding, launch_gaps
from orchestrator.analyze.units import ms

FIX = ("Keep the caching allocator's blocks: remove torch.cuda.empty_cache() (and gc.collect() + empty_cache) "
       "from the training loop; if it was added against fragmentation or out-of-memory, set "
       "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True instead. Pad or bucket changing shapes so blocks are "
       "reused; outside PyTorch allocate buffers once, or use cudaMallocAsync with a memory pool.")


@dataclass
class AllocatorChurn(Rule):
    kind = "allocator_churn"
    explains_idle = True
    reads = ("alloc_gaps", "small_gaps")
    min_calls_per_step: float = 2.0  # allocations + frees per iteration
    min_share_pct: float = 1.0  # CPU time in them, of the iterations

    def churning(self, ctx: Context) -> list[RankMemory]:
        """The ranks that allocate and free device memory every step: this finding's, whose
        allocator gaps the launch-gap and CPU-gap findings leave to it."""
        mem = ctx.report.memory
        return [] if mem is None else [
            r for r in mem.ranks
            if r.alloc_api_pct is not None and r.alloc_api_pct >= self.min_share_pct
            and (r.alloc_calls_per_step or 0) + (r.free_calls_per_step or 0) >= self.min_calls_per_step]

    def waited_ms(self, ctx: Context) -> dict[int, tuple[float, dict]]:
        """Per churning rank with allocator gaps: what the GPU waited for the calls (ms), and its
        alloc_gaps row."""
        churn = {r.rank for r in self.churning(ctx)}
        gaps, own = ctx.views.by_rank("alloc_gaps"), launch_gaps(ctx, churn)
        out = {}
        for rk in churn:
            g, lg = gaps.get(rk), own.get(rk) or {"n": 0, "ns": 0}
            if g and g["n"]:
                usual = lg["ns"] / lg["n"] if lg["n"] > 0 else 0.0
                out[rk] = (ms(max(g["ns"] - g["n"] * usual, 0.0)), g)
        return out

    def evaluate(self, ctx: Context) -> list[Finding]:
        hit = self.churning(ctx)
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
        waited = self.waited_ms(ctx)
        for rk, (w, g) in sorted(waited.items(), key=lambda kv: -kv[1][0])[:8]:
            ev.append(f"rank {rk}: the GPU waited {w} ms for them: {g['n']} gaps they fill at least a quarter of, "
                      f"{ms(g['ns'])} ms, less the rank's usual launch gap each")
        if waited:
            rk = max(waited, key=lambda r: (waited[r][0], -r))
            cost, pct = waited[rk][0], 100 * waited[rk][0] / win[rk] if win.get(rk) else 0.0
        else:
            worst = hit[0]
            cost, pct = (worst.alloc_api_pct or 0) / 100 * win.get(worst.rank, 0.0), worst.alloc_api_pct
        return [finding(self.kind, [r.rank for r in hit], "memory allocated and freed every step (allocator churn)",
                        ev, FIX, cost, pct=pct)]


RULE = AllocatorChurn()
