"""GPU idle while the CPU is inside an input-pipeline range (data loading, batch fetch...)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from orchestrator.analyze.model import Finding
from orchestrator.analyze.rules.base import DATA_RANGE, Context, Rule, cpu_state, finding, worst_first


@dataclass
class DataLoaderStall(Rule):
    kind = "data_loader_stall"
    explains_idle = True
    reads = ("gap_cpu",)
    # Reported when a rank's GPU idles in data ranges for at least this share of its window.
    min_share: float = 0.05

    def evaluate(self, ctx: Context) -> list[Finding]:
        win = ctx.window_ms()
        data: dict[int, float] = defaultdict(float)
        for r in ctx.report.ranks:
            for name, ms in r.gaps_by_range_ms.items():
                if DATA_RANGE.search(name):
                    data[r.rank] += ms
        stall = {rk: ms for rk, ms in data.items() if win.get(rk) and ms >= self.min_share * win[rk]}
        if not stall:
            return []
        worst = max(100 * ms / win[rk] for rk, ms in stall.items())
        evidence = []
        for rk, ms in worst_first(stall):
            evidence.append(f"rank {rk}: GPU idle {round(ms, 3)} ms inside data-loading ranges or between steps "
                            f"({round(100 * ms / win[rk], 1)}% of its window)")
            state = cpu_state(ctx, rk, lambda g: bool(DATA_RANGE.search(g)))
            if state:
                evidence.append(state)
        return [finding(self.kind, stall, "GPU idle while waiting for input data", evidence,
                        ctx.data_loader_fix(), max(stall.values()), pct=worst)]


RULE = DataLoaderStall()
