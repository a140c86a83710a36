"""GPU idle while the CPU is inside an input-pipeline range (data loading, batch fetch...).

Its cost is the idle, less what a pipeline stage would wait for its peer stages anyway: with
the input on time, a stage still waits the schedule's own bubble (the theory share of its
steps without the stall); the part of that it no longer waits, because the stall covers it,
is no saving."""

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
        hidden = {rk: self._bubble_hidden(ctx, rk, ms, win[rk]) for rk, ms in stall.items()}
        saving = {rk: ms - hidden[rk] for rk, ms in stall.items()}
        worst = max(100 * ms / win[rk] for rk, ms in saving.items())
        evidence = []
        for rk, ms in worst_first(stall):
            evidence.append(f"rank {rk}: GPU idle {round(ms, 3)} ms inside data-loading ranges or between steps "
                            f"({round(100 * ms / win[rk], 1)}% of its window)")
            if hidden[rk] > 0:
                evidence.append(f"rank {rk}'s pipeline stage would wait for its peers {round(hidden[rk], 3)} ms of "
                                "it anyway (the schedule's bubble, which the stall now covers): fixing its input "
                                f"saves {round(saving[rk], 3)} ms")
            state = cpu_state(ctx, rk, lambda g: bool(DATA_RANGE.search(g)))
            if state:
                evidence.append(state)
        return [finding(self.kind, stall, "GPU idle while waiting for input data", evidence,
                        ctx.data_loader_fix(), max(saving.values()), pct=worst)]

    @staticmethod
    def _bubble_hidden(ctx: Context, rk: int, stall_ms: float, window_ms: float) -> float:
        """The schedule's bubble that rank `rk`'s stage no longer waits for its peers because the
        stall covers it: theory x (window - stall) - its peer wait now, within [0, stall]."""
        stage = next((s for s in ctx.report.stages if rk in s.ranks), None)
        if stage is None or stage.theory_bubble_pct is None or stage.peer_wait_pct is None:
            return 0.0
        due = stage.theory_bubble_pct / 100 * (window_ms - stall_ms) - stage.peer_wait_pct / 100 * window_ms
        return min(max(due, 0.0), stall_ms)


RULE = DataLoaderStall()
