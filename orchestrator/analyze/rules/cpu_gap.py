"""GPU idle while the CPU is in some other NVTX range (not input loading)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from orchestrator.analyze.engine import DATA_RANGE
from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import (
    BETWEEN_STEPS_WORK,
    OTHER_WORK_FIX,
    Context,
    Rule,
    finding,
    worst_first,
)


@dataclass
class CpuGap(Rule):
    kind = "cpu_gap"
    explains_idle = True
    reads = ()
    # Reported when the GPU idles in one range for at least this share of a rank's window.
    min_share: float = 0.1

    def evaluate(self, ctx: Context) -> list[Finding]:
        win = ctx.window_ms()
        per: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        for r in ctx.report.ranks:
            for name, ms in r.gaps_by_range_ms.items():
                if not DATA_RANGE.search(name):
                    per[name][r.rank] += ms
        out = []
        for name, by_rank in per.items():
            hit = {rk: ms for rk, ms in by_rank.items() if win.get(rk) and ms >= self.min_share * win[rk]}
            if not hit:
                continue
            worst = max(100 * ms / win[rk] for rk, ms in hit.items())
            # Gaps no NVTX range explains are named by the loop thread's call (40_gaps.sql).
            call = name.removeprefix("loop thread in ")
            title = (f"GPU idle while the CPU is in `{name}`" if call == name
                     else "GPU idle while the loop thread runs Python between CUDA calls"
                     if call == "Python between CUDA calls"
                     else f"GPU idle while the loop thread is in `{call}`")
            out.append(finding(
                self.kind, hit, title,
                [f"rank {rk}: {round(ms, 3)} ms of GPU gaps >= {ctx.opts.gap_ms} ms in `{name}` "
                 f"({round(100 * ms / win[rk], 1)}% of its window)" for rk, ms in worst_first(hit)],
                OTHER_WORK_FIX if name == BETWEEN_STEPS_WORK else ctx.cpu_gap_fix(), max(hit.values()), pct=worst))
        return out


RULE = CpuGap()
