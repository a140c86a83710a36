"""Large host-to-device copies from pageable (not pinned) host memory."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding
from orchestrator.analyze.units import ms

FIX = ("Copy from pinned memory: pin_memory=True in the DataLoader (or tensor.pin_memory()) and "
       ".to(device, non_blocking=True); pageable host-to-device copies are synchronous and slower.")


@dataclass
class PageableMemcpy(Rule):
    kind = "pageable_memcpy"
    reads = ("memcpy_window",)
    min_bytes: int = 1 << 20  # ignore a few small pageable copies
    min_share: float = 0.01  # of the rank's window spent in them

    def evaluate(self, ctx: Context) -> list[Finding]:
        win = ctx.window_ms()
        tot: dict[int, list[float]] = defaultdict(lambda: [0, 0.0])
        for m in ctx.views.rows("memcpy_window"):
            if m["kind"] == "HtoD" and m["src_kind"] == "pageable":
                tot[m["rank"]][0] += int(m["bytes"] or 0)
                tot[m["rank"]][1] += ms(m["ns"])
        big = {rk: v for rk, v in tot.items()
               if v[0] >= self.min_bytes and win.get(rk) and v[1] >= self.min_share * win[rk]}
        if not big:
            return []
        return [finding(
            self.kind, big, "large host-to-device copies from pageable memory",
            [f"rank {rk}: {v[0] / 2**20:.1f} MiB pageable HtoD in {round(v[1], 3)} ms"
             for rk, v in sorted(big.items())],
            FIX, max(v[1] for v in big.values()), pct=max(100 * v[1] / win[rk] for rk, v in big.items()))]


RULE = PageableMemcpy()
