"""How many DataLoader workers would keep a rank's loop fed: what the data-loader finding and a
straggler late in its input both name in their fix, where the run's loop marks noted the rank's
loader (report.loaders). Its own module so that both rules read one computation.

A rank whose loop thread still waits for batches once its workers run is paced by them: in that
steady state the n workers deliver a batch every step, so each takes n x step for one, and
keeping up with the step the rank would take without waiting needs ceil(n x step / that) of
them. Without waiting means less its wait for the batch (the GPU's idle in input ranges, less
the epoch starts' where the workers start anew every epoch: their own finding) and less its wait
for the other ranks in collectives (exposed_wait_ms: a peer with a slower loader paces it too).
The count is for the job without the profiler, whose steps are shorter by nsys' own per-call
cost (capture_overhead): a loop fed at its profiled pace would still wait for its batches there."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from orchestrator.analyze.measurable import analysed_steps
from orchestrator.analyze.rules.base import Context
from orchestrator.metrics.engine import is_input_range
from orchestrator.ranklist import ranges

# orch's loop mark around DataLoader.__iter__ (templates/orch_loop_marks.py.j2): an epoch's start.
START = "orch: loader start"
# A wait under this share of the rank's window says nothing of its workers (the data-loader
# finding's own threshold).
MIN_SHARE = 0.05


@dataclass(frozen=True)
class Workers:
    """A loader whose workers set the loop's pace: how many, how many would keep up, the mean
    step and the loop thread's wait for a batch in it, a worker's time for one batch, the step
    without that wait or any wait for the other ranks in collectives, and nsys' estimated own
    cost in that step (ms)."""

    workers: int
    needed: int
    step_ms: float
    wait_ms: float
    batch_ms: float
    own_ms: float
    nsys_ms: float = 0.0

    def line(self, rank: int) -> str:
        """The evidence, in words."""
        return (f"rank {rank}: its {self.workers} DataLoader workers deliver a batch every {self.step_ms:.1f} ms on "
                f"average and the loop thread waits {self.wait_ms:.1f} ms of it for the next batch: each worker takes "
                f"about {self.batch_ms:.1f} ms a batch, and a step without waiting (for the batch or for the other "
                f"ranks) takes {self.own_ms:.1f} ms" + (
                    f" here, about {self.own_ms - self.nsys_ms:.1f} ms without the profiler (nsys' own per-call cost, "
                    f"estimated at {self.nsys_ms:.1f} ms a step)" if self.nsys_ms else ""))


def input_idle(ctx: Context) -> dict[int, float]:
    """Per rank, its GPU's idle in input-pipeline ranges (ms)."""
    data: dict[int, float] = defaultdict(float)
    for r in ctx.report.ranks:
        for name, ms in r.gaps_by_range_ms.items():
            if is_input_range(name):
                data[r.rank] += ms
    return dict(data)


def too_few_workers(ctx: Context, idle: dict[int, float], restart_ms: dict[int, float],
                    min_share: float = MIN_SHARE) -> dict[int, Workers]:
    """Per rank of `idle` paced by its workers (the module's docstring): its one loader with
    num_workers > 0, and a wait for batches, `idle` less `restart_ms` (the epoch starts'), of at
    least `min_share` of its window."""
    ranks = {r.rank: r for r in ctx.report.ranks}
    n_steps = len(analysed_steps(ctx.report))
    win = ctx.window_ms()
    over = ctx.report.capture_overhead
    nsys = {r.rank: r.est_ms for r in over.ranks} if over else {}
    out = {}
    for rk, ms in idle.items():
        mine = [s for s in ctx.report.loaders.get(rk, []) if s.num_workers]
        wait = ms - restart_ms.get(rk, 0.0)
        if len(mine) != 1 or not n_steps or rk not in ranks or not win.get(rk) or wait < min_share * win[rk]:
            continue
        step, per = win[rk] / n_steps, wait / n_steps
        own = step - per - (ranks[rk].exposed_wait_ms or 0.0) / n_steps
        n = mine[0].num_workers or 0
        cost = nsys.get(rk, 0.0) / n_steps
        if cost >= own:  # an estimate of nsys' cost at or above the step's own work says nothing of it
            cost = 0.0
        if own > 0:
            out[rk] = Workers(n, math.ceil(n * step / (own - cost) - 1e-9), step, per, n * step, own, cost)
    return out


def more_workers(few: dict[int, Workers]) -> str:
    """The fix's words for `too_few_workers`: one sentence for the ranks with as many workers,
    naming the most any of them needs (a job's ranks mostly run one loader)."""
    by_n: dict[int, list[int]] = defaultdict(list)
    for rk, w in few.items():
        by_n[w.workers].append(rk)
    return "".join(f"The {n} DataLoader workers of rank(s) {ranges(sorted(rks))} cannot keep up: "
                   f"DataLoader(num_workers={max(few[rk].needed for rk in rks)}) or more keeps the next batch ready "
                   "(each worker needs a CPU core), or make each batch cheaper to prepare. "
                   for n, rks in sorted(by_n.items()))
