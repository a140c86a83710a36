"""GPU idle while the CPU is inside an input-pipeline range (data loading, batch fetch...).

Its cost is the idle, less what a pipeline stage would wait for its peer stages anyway: with
the input on time, a stage still waits the schedule's own bubble (the theory share of its
steps without the stall); the part of that it no longer waits, because the stall covers it,
is no saving.

A rank that is the critical path's root while late in its input pipeline, where the other ranks
do not share the stall, is the straggler finding's: it names the rank the others wait for, and
its cost is what the steps would save at their pace. There this finding stays, as `info` without
a cost for that rank, so one fix is counted once. Where the job was replayed, what fixing the
input saves is the replay's: every rank's wait for input removed (61_replay.sql, `input on
time`), less what the straggler findings on its roots carry; within the replay's error it is
`info`. Where nothing was replayed across ranks (one GPU, a CPU job), each stalled rank's own GPU
work is replayed with its input on time (55_own_replay.sql, `input`: its launches after each wait
for input earlier by the loop thread's time in it), which also counts the launch gaps after the
idle, until the CPU is ahead of the GPU again: that saving, less the bubble above, is the rank's.
The per-rank figures above stay the evidence of where the wait is. Each stalled rank's
DataLoader settings (orch's loop marks, report.loaders) are evidence too, and a rank that loads
its batches in its loop thread (num_workers=0) is named in the fix.

A rank paced by its workers (loader_workers.py) keeps their pace without the profiler, while its
own work between batches is shorter by nsys' per-call cost: there it waits that much longer for
each batch, and fixing its input saves that much more. That is the finding's estimate without
the profiler (unprofiled_ms), with the estimate's calibrated error."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from orchestrator.analyze.loader_workers import (
    MIN_SHARE,
    START,
    Workers,
    input_idle,
    more_workers,
    too_few_workers,
)
from orchestrator.analyze.measurable import analysed_steps
from orchestrator.analyze.model_replay import INPUT
from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules import straggler
from orchestrator.analyze.rules.base import (
    OWN_INPUT,
    Context,
    Rule,
    cpu_state,
    finding,
    overhead_error_ms,
    own_replay,
    python_in_gaps,
    python_line,
    worst_first,
)
from orchestrator.metrics.engine import is_input_range
from orchestrator.ranklist import ranges

# The OS calls that start a process (the OS runtime's names): a DataLoader starting its workers.
FORKS = ("fork", "vfork", "clone", "clone3", "posix_spawn")


@dataclass
class DataLoaderStall(Rule):
    kind = "data_loader_stall"
    explains_idle = True
    # the critical path's, through straggler.reported; nsys' estimated cost per rank
    reads = ("gap_cpu", "gap_python", "cp_roots", "cp_steps", "capture_overhead", "own_replay")
    final = True  # after the straggler rule, whose roots it leaves their saving
    # Reported when a rank's GPU idles in data ranges for at least this share of its window.
    min_share: float = MIN_SHARE

    def evaluate(self, ctx: Context) -> list[Finding]:
        win = ctx.window_ms()
        stall = self.stalled(ctx)
        if not stall:
            return []
        hidden = {rk: self._bubble_hidden(ctx, rk, ms, win[rk]) for rk, ms in stall.items()}
        roots = {r.rank for r in straggler.RULE.reported(ctx)
                 if r.rank in stall and is_input_range(r.phase) and not r.shared}
        replay = ctx.report.replay
        on_time = replay.removed(INPUT) if replay else None
        own = own_replay(ctx, OWN_INPUT) if on_time is None else {}
        saving = {rk: 0.0 if rk in roots else max(own[rk][0] if rk in own else ms, hidden[rk]) - hidden[rk]
                  for rk, ms in stall.items()}
        worst = max(100 * ms / win[rk] for rk, ms in saving.items())
        evidence = []
        for rk, ms in worst_first(stall):
            evidence.append(f"rank {rk}: GPU idle {round(ms, 3)} ms inside data-loading ranges or between steps "
                            f"({round(100 * ms / win[rk], 1)}% of its window)")
            if rk in roots:
                evidence.append(f"rank {rk} holds the others up while it waits for its input: the straggler "
                                "finding on it carries what fixing it saves")
            elif rk in own:
                evidence.append(f"rank {rk}: replayed on its own GPU with its input on time (the loop thread's "
                                f"{round(own[rk][1], 3)} ms waiting for input gone, its launches after it that much "
                                f"earlier; the unchanged trace replays exactly), its work ends {round(own[rk][0], 3)} "
                                "ms earlier: the idle while it waited and the launch gaps after it, until the CPU is "
                                "ahead again" + (f"; less the {round(hidden[rk], 3)} ms its stage would wait for its "
                                                 "peers anyway" if hidden[rk] > 0 else ""))
            elif hidden[rk] > 0:
                evidence.append(f"rank {rk}'s pipeline stage would wait for its peers {round(hidden[rk], 3)} ms of "
                                "it anyway (the schedule's bubble, which the stall now covers): fixing its input "
                                f"saves {round(saving[rk], 3)} ms")
            state = cpu_state(ctx, rk, is_input_range)
            if state:
                evidence.append(state)
            py = python_in_gaps(ctx, rk, is_input_range)
            if py:
                evidence.append(python_line(rk, py))
            evidence += [f"rank {rk}'s {s.line}" + (": no workers, the loop thread loads every batch itself"
                                                     if s.num_workers == 0 else "")
                         for s in ctx.report.loaders.get(rk, [])]
        cost, severity = max(saving.values()), "info" if set(stall) <= roots else None
        if replay and on_time:
            claimed = sum(f.cost_ms for f in ctx.findings if f.kind == "straggler" and set(f.ranks) & roots)
            cost = max(on_time.saving_ms - claimed, 0.0)
            evidence.append(f"replayed with every rank's wait for input removed, the {on_time.steps} steps take "
                            f"{on_time.change}; the replay of the unchanged trace is within {replay.error_pct}% of it"
                            + (f"; the straggler finding on rank(s) {sorted(roots)} carries {round(claimed, 3)} ms of "
                               "it" if claimed else ""))
            # its share of the steps' time, as the what-if's
            worst = round(cost / on_time.saving_ms * on_time.saving_pct, 2) if on_time.saving_ms > 0 else 0.0
            if cost <= replay.error_ms:
                severity = "info"
        alone = [rk for rk in sorted(stall) if any(s.num_workers == 0 for s in ctx.report.loaders.get(rk, []))]
        restart = self.restarting(ctx, stall)
        few = too_few_workers(ctx, stall, {rk: ms for rk, (ms, _) in restart.items()}, self.min_share)
        evidence += [w.line(rk) for rk, w in sorted(few.items())]
        bare = (self._unprofiled(ctx, cost, {rk: w for rk, w in few.items() if rk not in roots and not hidden[rk]})
                if severity != "info" else None)
        if bare:
            evidence.append(bare[2])
        evidence += [f"rank {rk}: {round(ms, 3)} ms of it while the loop thread started an epoch's batches (`{START}`: "
                     "DataLoader.__iter__), where a loader without persistent_workers starts its workers anew"
                     + (f": {round(forked, 3)} ms in `fork`, starting processes" if forked else "")
                     for rk, (ms, forked) in worst_first(restart, lambda v: v[0])]
        fix = (f"Rank(s) {ranges(alone)} load their batches in the loop thread (DataLoader num_workers=0): give the "
               "loader workers to prepare them ahead (num_workers=4-8, persistent_workers=True). "
               if alone else "") + (
               f"Rank(s) {ranges(sorted(restart))} start their DataLoader's workers anew every epoch: "
               "DataLoader(..., persistent_workers=True) keeps them, and their prefetched batches, from one epoch to "
               "the next. " if restart else "") + more_workers(few) + ctx.data_loader_fix(bool(few))
        return [finding(self.kind, stall, "GPU idle while waiting for input data", evidence, fix, cost, pct=worst,
                        severity=severity, unprofiled_ms=bare[0] if bare else None,
                        unprofiled_err_ms=bare[1] if bare else None)]

    @staticmethod
    def _unprofiled(ctx: Context, cost: float, paced: dict[int, Workers]) -> tuple[float, float, str] | None:
        """What fixing the input saves without the profiler, its standard error and the evidence:
        `cost` and the longer wait of the paced rank that waits most longer (the class docstring)."""
        n = len(analysed_steps(ctx.report))
        paced = {rk: w for rk, w in paced.items() if w.nsys_ms > 0}
        if not paced or not n or cost <= 0:
            return None
        rk = max(paced, key=lambda r: (paced[r].nsys_ms, -r))
        extra = paced[rk].nsys_ms * n
        over = ctx.views.by_rank("capture_overhead")
        err = overhead_error_ms(over[rk], extra) if rk in over else 0.0
        return cost + extra, err, (
            f"rank {rk}: without the profiler its own work between batches is shorter by nsys' per-call cost "
            f"({paced[rk].nsys_ms:.1f} ms a step, estimated) while its workers keep their pace: it waits that much "
            f"longer for each batch, and fixing its input saves about {round(cost + extra, 3)} ms there")

    @staticmethod
    def restarting(ctx: Context, stall: dict[int, float]) -> dict[int, tuple[float, float]]:
        """Per stalled rank whose workers start anew every epoch: its idle while the loop thread
        started an epoch's batches (orch's loop marks: `orch: loader start`), and the time of it
        the thread spent starting processes. The workers start anew where the rank's loader says
        it has workers that are not persistent (the run's loop marks noted it), or, for reports
        without the run, where the thread forked in that idle (gap_cpu)."""
        forked: dict[int, float] = defaultdict(float)
        for g in ctx.views.rows("gap_cpu"):
            if g["range_group"] == START and g["call"] in FORKS:
                forked[g["rank"]] += float(g["ns"]) / 1e6
        out = {}
        for r in ctx.report.ranks:
            ms = r.gaps_by_range_ms.get(START, 0.0)
            anew = any(s.num_workers and s.persistent_workers is False for s in ctx.report.loaders.get(r.rank, []))
            if r.rank in stall and ms > 0 and (anew or forked.get(r.rank)):
                out[r.rank] = (ms, forked.get(r.rank, 0.0))
        return out

    def stalled(self, ctx: Context) -> dict[int, float]:
        """Per rank whose GPU idles in input-pipeline ranges for `min_share` of its window or more:
        that idle in ms."""
        win = ctx.window_ms()
        return {rk: ms for rk, ms in input_idle(ctx).items() if win.get(rk) and ms >= self.min_share * win[rk]}

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
