"""A rank whose GPU memory peak is close to the GPU's capacity: the next larger batch, longer
sequence or fragmentation is an out-of-memory error.

From `report.memory` (views `mem_rank`, `mem_spread`): the highest bytes in use inside the
window against TARGET_INFO_GPU.totalMemory. The peak is a lower bound (the CUDA context and
memory held before the capture are not in nsys' events), so the real headroom is smaller.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding

FIX = ("Lower the peak: activation checkpointing, a smaller micro-batch (with gradient accumulation to keep "
       "the global batch), bf16 weights/activations, sharded optimizer state and parameters (FSDP/ZeRO); against "
       "fragmentation set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True. When one rank or pipeline stage "
       "peaks well above the others (stage 0 holds the embedding and the most in-flight activations), "
       "rebalance the layers or shards.")
GIB = 2**30


@dataclass
class MemoryNearCapacity(Rule):
    kind = "memory_near_capacity"
    reads = ()
    min_peak_pct: float = 90.0  # of the GPU's memory
    high_peak_pct: float = 97.0

    def evaluate(self, ctx: Context) -> list[Finding]:
        mem = ctx.report.memory
        if mem is None:
            return []
        hit = [r for r in mem.ranks if r.peak_pct is not None and r.peak_pct >= self.min_peak_pct]
        if not hit:
            return []
        hit.sort(key=lambda r: (-(r.peak_pct or 0), r.rank))
        ev = [f"rank {r.rank}: peak {(r.peak_bytes or 0) / GIB:.2f} GiB of {(r.capacity_bytes or 0) / GIB:.2f} GiB "
              f"({r.peak_pct:.1f} %), headroom {(r.headroom_bytes or 0) / GIB:.2f} GiB (at most: the CUDA context "
              "is not counted)" for r in hit[:8]]
        if len(hit) > 8:
            ev.append(f"... and {len(hit) - 8} more rank(s)")
        if len(mem.ranks) > 1 and mem.peak_rank is not None and mem.spread_bytes is not None:
            top = ctx.report.rank(mem.peak_rank)
            stage = f" (pipeline stage {top.stage})" if top is not None and top.stage is not None else ""
            ev.append(f"highest peak on rank {mem.peak_rank}{stage}; peaks across {len(mem.ranks)} ranks differ by "
                      f"{mem.spread_bytes / GIB:.2f} GiB (median {(mem.median_peak_bytes or 0) / GIB:.2f} GiB)")
        worst = hit[0]
        sev = "high" if (worst.peak_pct or 0) >= self.high_peak_pct else "medium"
        return [finding(self.kind, [r.rank for r in hit],
                        f"GPU memory near capacity on rank {worst.rank} ({worst.peak_pct:.1f} % at peak)",
                        ev, FIX, 0.0, severity=sev)]


RULE = MemoryNearCapacity()
