"""Synchronous copies and memsets (nsys analyze cuda-sync-memcpy / cuda-sync-memset), per rank.

cudaMemcpy / cudaMemset without Async block the calling thread until the GPU has done them; the
cost is the CPU time blocked in the calls (view `sync_copies`, metrics/sql/99_nsys_rules.sql).
Small (<= 64000 B) host-to-device copies and device-to-device copies are left out, as nsys does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding
from orchestrator.analyze.units import ms

FIX = {
    "memcpy": ("Use cudaMemcpyAsync on a stream: in PyTorch .to(device, non_blocking=True) from pinned memory, "
               "and avoid .cpu()/.numpy()/.item() inside the loop; copy results back once, after the step."),
    "memset": ("Use cudaMemsetAsync on the work stream (torch.zeros_like/fill_ on the GPU are async); a "
               "synchronous cudaMemset waits for all earlier work."),
}


@dataclass
class SyncMemcpy(Rule):
    kind: ClassVar[str] = "sync_memcpy"
    reads = ("sync_copies",)
    what: ClassVar[str] = "memcpy"
    min_share: float = 0.005  # of the window blocked in them
    min_calls: int = 1

    def evaluate(self, ctx: Context) -> list[Finding]:
        win = ctx.window_ms()
        hit = [r for r in ctx.views.rows("sync_copies")
               if r["what"] == self.what and r["n"] >= self.min_calls and win.get(r["rank"])
               and ms(r["api_ns"]) >= self.min_share * win[r["rank"]]]
        if not hit:
            return []
        worst = max(hit, key=lambda r: r["api_ns"] / win[r["rank"]])
        return [finding(
            self.kind, [r["rank"] for r in hit], f"synchronous {self.what}s block the CPU",
            [f"rank {r['rank']}: {r['n']} {r['top_api']} calls"
             + (f" ({r['n'] / r['n_steps']:.1f} per step)" if r["n_steps"] else "")
             + f", {r['bytes'] / 2**20:.1f} MiB, CPU blocked {ms(r['api_ns'])} ms "
               f"(GPU {ms(r['gpu_ns'])} ms)" for r in sorted(hit, key=lambda r: r["rank"])],
            FIX[self.what], ms(worst["api_ns"]), pct=100 * ms(worst["api_ns"]) / win[worst["rank"]])]


RULE = SyncMemcpy()
