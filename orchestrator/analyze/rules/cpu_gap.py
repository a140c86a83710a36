"""GPU idle while the CPU is in some other NVTX range (not input loading)."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.allocator_churn import RULE as ALLOCATOR
from orchestrator.analyze.rules.base import (
    BETWEEN_STEPS_WORK,
    OTHER_WORK_FIX,
    Context,
    Rule,
    finding,
    one_offs,
    python_in_gaps,
    python_line,
    worst_first,
)
from orchestrator.metrics.engine import CALL_GAP, is_input_range

PYTHON = CALL_GAP + "Python between CUDA calls"
# The loop thread in a device allocation or free, the calls alloc_api counts (40_gaps.sql;
# not cudaMallocHost's pinned host memory): 40_gaps.sql names such a gap by the call.
ALLOC_CALL = re.compile(re.escape(CALL_GAP) + r"(cudaMalloc(Async|FromPoolAsync|Managed|Pitch|3D)?|cudaFree(Async)?|"
                        r"cuMemAlloc(Async|FromPoolAsync|Managed|Pitch)?|cuMemCreate|cuMemFree(Async)?|"
                        r"cuMemRelease)(_v\d+)?$")
PYTHON_FIX = (
    "The loop thread runs {func} while the GPU has nothing queued: vectorise it or run it on the GPU, move it "
    "into the Dataset or collate_fn (the DataLoader's workers then run it ahead of the step), or do it less often."
)


@dataclass
class CpuGap(Rule):
    kind = "cpu_gap"
    explains_idle = True
    reads = ("gap_python", "oneoff_gaps")  # what orch's Python samples found in the gaps; one-off steps' idle
    # Reported when the GPU idles in one range for at least this share of a rank's window.
    min_share: float = 0.1

    def evaluate(self, ctx: Context) -> list[Finding]:
        win = ctx.window_ms()
        # A churning rank's gaps in its allocator calls are the allocator churn finding's.
        churn = {r.rank for r in ALLOCATOR.churning(ctx)}
        once = one_offs(ctx)
        per: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        for r in ctx.report.ranks:
            for name, ms in r.gaps_by_range_ms.items():
                if not is_input_range(name) and not (r.rank in churn and ALLOC_CALL.match(name)):
                    per[name][r.rank] += ms - (once[r.rank].by_range.get(name, 0.0) if r.rank in once else 0.0)
        out = []
        for name, by_rank in per.items():
            hit = {rk: ms for rk, ms in by_rank.items() if win.get(rk) and ms >= self.min_share * win[rk]}
            if not hit:
                continue
            worst = max(100 * ms / win[rk] for rk, ms in hit.items())
            # Gaps no NVTX range explains are named by the loop thread's call (40_gaps.sql).
            call = name.removeprefix(CALL_GAP)
            title = (f"GPU idle while the CPU is in `{name}`" if call == name
                     else "GPU idle while the loop thread runs Python between CUDA calls"
                     if name == PYTHON else f"GPU idle while the loop thread is in `{call}`")
            evidence = [f"rank {rk}: {round(ms, 3)} ms of GPU gaps >= {ctx.opts.gap_ms} ms in `{name}` "
                        f"({round(100 * ms / win[rk], 1)}% of its window)" for rk, ms in worst_first(hit)]
            evidence += [once[rk].line(rk, once[rk].by_range[name]) for rk in sorted(hit)
                         if rk in once and once[rk].by_range.get(name)]
            fix = OTHER_WORK_FIX if name == BETWEEN_STEPS_WORK else ctx.cpu_gap_fix()
            py = {rk: f for rk in hit if (f := python_in_gaps(ctx, rk, lambda g, n=name: g == n))}
            cost = max(hit.values())
            if py:
                evidence += [python_line(r, found) for r, found in sorted(py.items())[:4]]
                if name == PYTHON:
                    # The fix names the function the samples found most: it saves that function's
                    # share of the idle time, on the rank where that is most.
                    worst_rank = max(py, key=lambda r: hit[r] * py[r][2] / py[r][3])
                    title += f": {py[worst_rank][1]}"
                    fix = ctx.worded(PYTHON_FIX.format(func=py[worst_rank][0]), fix)
                    cost = hit[worst_rank] * py[worst_rank][2] / py[worst_rank][3]
                    evidence.append(f"fixing {py[worst_rank][0]} saves its share of rank {worst_rank}'s idle time: "
                                    f"{round(cost, 3)} ms")
            out.append(finding(self.kind, hit, title, evidence, fix, cost, pct=worst))
        return out


RULE = CpuGap()
