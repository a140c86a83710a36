"""The rank that holds the others up, from every step's critical path across ranks
(59_critical_path.sql): the walk back from the step's end through the waits stops at work
nobody waited for, and a rank whose lateness is explained by its own earlier wait (a stage-1
rank that reaches its all-reduce last because its activations came late) is a victim, whatever
it does later. The finding costs what the steps would lose with the root at the others' pace
(cp_roots.saving_ns), not the sum of its victims' waiting (two victims of one delay are one
delay, and a DDP bucket waiting in the queue behind the one before is no new delay). Where the
job was replayed (61_replay.sql), the cost is what the replay with the root at its stage peers'
pace saves, and the roots are ranked by it; a saving within the replay's error is `info`."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from orchestrator.analyze.loader_workers import START, input_idle, more_workers, too_few_workers
from orchestrator.analyze.model_report import Finding, Severity
from orchestrator.analyze.rules.base import (
    BETWEEN_STEPS_WORK,
    OTHER_WORK_FIX,
    Context,
    Rule,
    finding,
    severity_for,
)
from orchestrator.analyze.units import ms
from orchestrator.metrics.engine import is_input_range
from orchestrator.ranklist import ranges

NO_CAUSE_FIX = ("No CPU-side cause is visible: its GPU was computing. Compare rank {rk}'s kernel times and GPU "
                "clocks with the others (nvidia-smi -q -d CLOCK,PERFORMANCE: throttling, ECC, PCIe/NVLink), its "
                "input sizes (uneven shards or sequence lengths), and its host (CPU contention, NUMA).")
COMPUTE = "GPU compute"


@dataclass(frozen=True)
class Root:
    """A reported root: its cp_roots rows, the phase it fell behind in and the excess it put on
    the path by phase, its excess and median saving per step it holds up, and every rank's idle
    in that phase where every rank idles there (a shared cause; empty otherwise)."""

    rank: int
    rows: list[dict]
    phase: str
    by_phase: dict[str, int]
    created_ns: int
    typical_ns: int
    shared: dict[int, float]


@dataclass
class Straggler(Rule):
    kind = "straggler"
    explains_idle = True
    root = True
    reads = ("cp_roots", "cp_steps", "kernel_excess", "kernel_excess_rank", "cpu_call_excess", "small_gaps",
             "capture_overhead")
    # A root is reported when it is late in collectives far more often than chance (the
    # `stragglers` view); or when in at least `min_outlier_steps` steps it put this share of a
    # median step on the path; or when it is the root of at least half the steps, holding each
    # up by a median of `consistent_ms` or more (a slow pipeline stage has no collectives to be
    # late in). The small skews of a healthy job and one hiccup stay quiet.
    outlier_share: float = 0.5
    min_outlier_steps: int = 2
    consistent_ms: float = 5.0
    # A cause every rank shows (all ranks idle in the same range for at least this share of
    # their window) outranks the rank that shows it most: fix the shared cause first.
    shared_share: float = 0.05
    # A CPU range (or work between steps) is named as the cause when the steps it explains hold at
    # least this share of the excess; otherwise the root's GPU was computing.
    cause_share: float = 0.3
    # Victims that the collectives' statistics call late get a line each, up to this many.
    shown_late_victims: int = 8
    # "The median rank" is the other ranks' median (the views' loo_ref; of two ranks, the other).
    # A root "computing on the GPU" whose kernels take less than this share of the excess it puts
    # on a step longer than the median rank's computes no more than the others: its GPU work
    # starts late. Kernels exceeding the median rank's by less than `shown_kernel_ms` a step are
    # not named.
    kernel_share: float = 0.25
    shown_kernel_ms: float = 0.05

    def reported(self, ctx: Context) -> list[Root]:
        """The roots this rule reports, the costliest first: the one decision of who is reported
        and in which phase, which the data-loader finding asks too (a root late in its own input
        pipeline is reported here, and that finding then leaves the saving to it)."""
        roots, steps = ctx.views.rows("cp_roots"), ctx.views.rows("cp_steps")
        if not roots or not steps:
            return []
        spans = sorted(s["t1"] - s["t0"] for s in steps)
        median_ns = spans[len(spans) // 2]
        stats = {s.rank for s in ctx.report.stragglers}
        per: dict[int, list[dict]] = defaultdict(list)
        for r in roots:
            per[r["rank"]].append(r)
        out = []
        for rk, rows in sorted(per.items(), key=lambda kv: (-self._saving(ctx, kv[0], kv[1]), kv[0])):
            created = sum(r["created_ns"] for r in rows)
            outliers = [r for r in rows if r["saving_ns"] >= self.outlier_share * median_ns]
            typical = sorted(r["saving_ns"] for r in rows)[len(rows) // 2]
            consistent = 2 * len(rows) >= len(steps) and ms(typical) >= self.consistent_ms
            if rk not in stats and len(outliers) < self.min_outlier_steps and not consistent:
                continue
            by_phase: dict[str, int] = defaultdict(int)
            for r in rows:
                by_phase[r["phase"] or COMPUTE] += r["created_ns"]
            named = [p for p in by_phase if p != COMPUTE]
            top = max(named, key=lambda p: (by_phase[p], p)) if named else COMPUTE
            phase = top if by_phase[top] >= self.cause_share * created else COMPUTE
            out.append(Root(rk, rows, phase, dict(by_phase), created, typical, self._shared(ctx, phase)))
        return out

    def evaluate(self, ctx: Context) -> list[Finding]:
        reported = self.reported(ctx)
        if not reported:
            return []
        steps = ctx.views.rows("cp_steps")
        # The steps' time is their wall time, first start to last end: a step's span (its first
        # GPU work to its last on any rank) overlaps the next step's where ranks run apart.
        total_ns = (max(s["t1"] for s in steps) - min(s["t0"] for s in steps)) or 1
        stats = {s.rank: s for s in ctx.report.stragglers}
        ranks = {r.rank: r for r in ctx.report.ranks}
        out: list[Finding] = []
        by_shared: dict[str, list[tuple[Finding, float]]] = defaultdict(list)
        for root in reported:
            rk, rows, phase, by_phase, created, typical, shared = (
                root.rank, root.rows, root.phase, root.by_phase, root.created_ns, root.typical_ns, root.shared)
            saving, path_saving = self._saving(ctx, rk, rows), sum(r["saving_ns"] for r in rows)
            replay, what_if = ctx.report.replay, ctx.report.what_if(rk)
            pct = what_if.saving_pct if what_if else round(100 * saving / total_ns, 2)
            victims = sorted({v for r in rows for v in r["victims"]})
            share = sorted(r["share_pct"] for r in rows)[len(rows) // 2]
            evidence = [
                f"rank {rk} is the root of the critical path in {len(rows)} of {len(steps)} steps: it put "
                f"{ms(created)} ms of waiting on it (median {share}% of a step it holds up); at the "
                f"others' pace those steps would take {ms(path_saving)} ms less "
                f"({round(100 * path_saving / total_ns, 2)}% of the steps' time; median {ms(typical)} ms a step it "
                "holds up)",
                "while it fell behind: " + ", ".join(f"`{p}` {ms(n)} ms" for p, n in
                                                     sorted(by_phase.items(), key=lambda kv: -kv[1])),
            ]
            longer, late_start, call, launches = "", False, None, None
            if phase == COMPUTE:
                lines, longer, late_start = self._kernels(ctx, rk, typical)
                evidence += lines
                call = self._call(ctx, rk, typical) if late_start else None
                launches = self._launches(ctx, rk, typical, len(steps)) if late_start and not call else None
                if call:
                    evidence.append(
                        f"rank {rk}'s loop thread spends {ms(call['ns_per_step'])} ms a step in "
                        f"`{call['name']}` against {ms(call['median_ns_per_step'])} ms on the median rank "
                        f"(+{ms(call['excess_ns_per_step'])} ms a step more than the others)")
                if launches:
                    evidence.append(
                        f"rank {rk}'s GPU waits {ms(launches[0])} ms a step between kernels (gaps under "
                        f"{ctx.opts.gap_ms} ms) against {ms(launches[1])} ms on the median rank: its CPU "
                        "launches the same kernels slower")
            if what_if and replay and not what_if.replayed:
                evidence.append(f"in the replay of the job rank {rk} held nobody up (never alone the last to start a "
                                "synchronisation or to end a step): at its stage peers' pace the steps would take "
                                "no less")
            elif what_if and replay:
                evidence.append(f"replayed with rank {rk}'s own work (GPU and CPU) at its stage peers' median, the "
                                f"{what_if.steps} steps take {ms(saving)} ms less ({pct}% of their time); the replay "
                                f"of the unchanged trace is within {replay.error_pct}% of it")
            s = stats.get(rk)
            if s:
                evidence.append(f"rank {rk} started last in {s.late_count} of {s.collectives} collectives (chance: "
                                f"1 in {s.group_size}; p={s.p_value:.2g}), median {s.median_lateness_ms} ms late")
            evidence += self._victims(rk, victims, stats)
            severity: Severity = severity_for(pct)
            if shared:
                lo, hi = min(shared.values()), max(shared.values())
                evidence.append(f"every rank idles in `{phase}` ({lo}-{hi} ms): a shared cause, which rank {rk} "
                                "shows most; the shared finding comes first")
                severity = "medium" if severity == "high" else severity
            if what_if and replay and ms(saving) <= replay.error_ms:
                evidence.append(f"that saving is within the replay's error ({replay.error_ms} ms): rank {rk} is "
                                "no cause the replay can tell from the trace's own noise")
                severity = "info"
            # Late GPU work with no call of its own to name, in a loop launch-bound on every rank.
            everywhere = self._launch_bound_everywhere(ctx, len(steps)) if late_start and not call else {}
            # The profiler's cost over the same steps the saving is counted on.
            spent = round(sum(st.measured_ms for st in replay.steps) * 1e6) if what_if and replay else total_ns
            profiler = self._profiler(ctx, rk, saving, spent) if late_start and not call and not everywhere else None
            if profiler:
                evidence.append(f"what fixing it saves, {ms(saving)} ms, is within what tracing cost rank {rk} "
                                f"over these steps (~{ms(profiler)} ms: nsys' per-call cost of its CUDA calls, "
                                "as far as its launch gaps show it): the profiler can account for it, and where its "
                                "cost lands changes from run to run; time the job without it before acting")
                severity = "info"
            if everywhere:
                lo, hi = min(everywhere.values()), max(everywhere.values())
                evidence.append(f"every rank's GPU waits between its kernels ({lo}-{hi} ms a step): the loop is "
                                "launch-bound on every rank, and which rank launches slowest can change from run to "
                                "run; make launching cheaper on every rank first (CUDA graphs, fused ops), and look at "
                                f"rank {rk}'s placement if every run names it")
                severity = "info"
            # Late in an input pipeline every rank idles in: the data-loader finding covers every rank
            # and carries what fixing it saves, counted once (one rank's slow input stays this finding's).
            folded = bool(shared) and is_input_range(phase)
            if folded:
                evidence.append("every rank's GPU waits for its input: the data-loader finding is this cause, and "
                                "what fixing it saves is counted there")
                severity = "info"
            where = (f" (in `{phase}`)" if phase != COMPUTE else
                     f" (GPU work starting late: its loop thread in `{call['name']}`)" if call else
                     " (GPU work starting late: its kernel launches are slower)" if launches else
                     " (GPU work starting late)" if late_start else " (GPU computing)")
            title = (f"rank {rk} is a straggler{where}" if s else
                     f"rank {rk} holds up rank(s) {ranges(victims, most=6)}{where}")
            out.append(finding(self.kind, [rk], title, evidence,
                               self._fix(ctx, rk, phase, longer, late_start, call and call["name"],
                                         launches is not None),
                               0.0 if folded else ms(saving), pct=0.0 if folded else pct,
                               severity=severity, victims=[v for v in victims if v in ranks]))
            if shared:
                by_shared[phase].append((out[-1], ms(saving)))
        for phase, fs in by_shared.items():  # ranks that take turns in a shared cause: one finding
            if len(fs) > 1:
                out = [f for f in out if f not in [f for f, _ in fs]] + [self._turns(ctx, phase, fs)]
        return out

    @staticmethod
    def _saving(ctx: Context, rk: int, rows: list[dict]) -> int:
        """What fixing the root saves, in ns: the replay's what-if with the rank at its stage
        peers' pace where the job was replayed, else what its critical-path steps would lose."""
        what_if = ctx.report.what_if(rk)
        if what_if is not None:
            return round(what_if.saving_ms * 1e6)
        return sum(r["saving_ns"] for r in rows)

    def _victims(self, rk: int, victims: list[int], stats: dict) -> list[str]:
        """A line for each victim that looks late by the collectives' statistics (up to
        `shown_late_victims`), one line for all the others, as rank ranges."""
        late = [v for v in victims if v in stats][: self.shown_late_victims]
        out = [f"rank {v} started last in {stats[v].late_count} of {stats[v].collectives} collectives, but waited "
               f"for rank {rk}'s lateness (directly, or after waiting for a rank that waited for it): a victim, "
               "not the cause" for v in late]
        rest = [v for v in victims if v not in late]
        if len(rest) == 1:
            out.append(f"rank {rest[0]} waited for rank {rk}'s lateness (directly, or after waiting for a rank that "
                       "waited for it): a victim, not the cause")
        elif rest:
            out.append(f"ranks {ranges(rest)} ({len(rest):,} ranks) waited for rank {rk}'s lateness (directly, or "
                       "after waiting for a rank that waited for it): victims, not the cause")
        return out

    def _turns(self, ctx: Context, phase: str, fs: list[tuple[Finding, float]]) -> Finding:
        """One finding for the ranks that take turns holding each other up in a shared cause;
        its cost is theirs, none where each was folded into the data-loader finding."""
        rks = sorted(r for f, _ in fs for r in f.ranks)
        names = ", ".join(map(str, rks))
        evidence = [f"ranks {names} take turns as the root of the critical path, each while in `{phase}`: "
                    + "; ".join(f"rank {f.ranks[0]} {ms} ms" for f, ms in fs)]
        evidence += [e for e in fs[0][0].evidence if e.startswith("every rank idles")]
        evidence += [e for e in fs[0][0].evidence if e.startswith("every rank's GPU waits for its input")]
        fix = (ctx.data_loader_fix() if is_input_range(phase) else
               f"Every rank is slow in `{phase}`: make it faster everywhere; then the slowest rank's share.")
        order = ("high", "medium", "low", "info")
        return finding(self.kind, rks, f"ranks {names} take turns holding each other up (in `{phase}`, a cause "
                       "every rank shares)", evidence, fix, sum(f.cost_ms for f, _ in fs),
                       pct=sum(f.cost_pct or 0.0 for f, _ in fs),
                       severity=min((f.severity for f, _ in fs), key=order.index))

    def _shared(self, ctx: Context, phase: str) -> dict[int, float]:
        """Every rank's GPU idle in `phase`, when every rank idles there for a share of its window."""
        if phase == COMPUTE:
            return {}
        idle = {r.rank: r.gaps_by_range_ms.get(phase, 0.0) for r in ctx.report.ranks}
        ok = all(idle[r.rank] >= self.shared_share * r.window_ms for r in ctx.report.ranks)
        return idle if ok and len(idle) > 1 else {}

    def _launch_bound_everywhere(self, ctx: Context, n_steps: int) -> dict[int, float]:
        """Every rank's GPU wait between kernels (small_gaps) in ms a step, when on every rank it
        is `shared_share` of the window or more: slower launches on one rank are then the
        shared launch-boundness at its worst (on a 2-GPU machine the slowest rank changed from
        run to run of one job)."""
        gaps = ctx.views.by_rank("small_gaps")
        per = {r.rank: ms(gaps[r.rank]["ns"], 6) if r.rank in gaps else 0.0 for r in ctx.report.ranks}
        ok = len(per) > 1 and all(per[r.rank] >= self.shared_share * r.window_ms for r in ctx.report.ranks)
        return {rk: round(ms / n_steps, 3) for rk, ms in per.items()} if ok else {}

    @staticmethod
    def _profiler(ctx: Context, rk: int, saving_ns: int, total_ns: int) -> int | None:
        """What tracing cost the root over the steps' time (capture_overhead's estimate, nsys' own
        time and per-call cost, at most its launch gaps, as a share of its window), when fixing
        it would save no more than that: a root with no cause of its own whose lateness the
        profiler can account for (on 4 GPUs the even pipeline's launch-slow rank was another
        rank in a rerun, and the job ran 147 ms a step unprofiled against 170-180 ms profiled)."""
        over = ctx.views.by_rank("capture_overhead").get(rk)
        if not over or not over["window_ns"]:
            return None
        cost = int(over["est_ns"] / over["window_ns"] * total_ns)
        return cost if saving_ns <= cost else None

    def _kernels(self, ctx: Context, rk: int, typical_ns: int) -> tuple[list[str], str, bool]:
        """What the root's GPU computes more than the median rank's, per step (kernel_excess):
        evidence lines, the kernels that make it longer in words (for the fix), and whether its
        kernels take no longer than the others' (then its GPU work starts late)."""
        tot = next((r for r in ctx.views.rows("kernel_excess_rank") if r["rank"] == rk), None)
        if tot is None:  # a rank with no computing kernels (a collectives benchmark): its collectives start late
            return [], "", any(r.rank == rk and not r.compute_ms for r in ctx.report.ranks)
        ks = [k for k in ctx.views.rows("kernel_excess")
              if k["rank"] == rk and ms(k["excess_ns_per_step"]) >= self.shown_kernel_ms]
        named = "; ".join(f"`{k['short_name']}` {k['n_per_step']:.3g} a step against {k['median_n_per_step']:.3g}, "
                          f"+{ms(k['excess_ns_per_step'])} ms" for k in ks)
        lines = [f"rank {rk}'s computing kernels take {ms(tot['ns_per_step'])} ms a step against "
                 f"{ms(tot['median_ns_per_step'])} ms on the median rank "
                 f"({ms(tot['excess_ns_per_step']):+} ms; it holds a step it is the root of up by a median "
                 f"{ms(typical_ns)} ms)" + (f"; most above the median rank's: {named}" if named else "")]
        late_start = tot["excess_ns_per_step"] < self.kernel_share * typical_ns
        return lines, named or f"+{ms(tot['excess_ns_per_step'])} ms of kernels a step", late_start

    def _call(self, ctx: Context, rk: int, typical_ns: int) -> dict | None:
        """The OS call the root's loop thread spends most time in beyond the median rank's
        (cpu_call_excess), when that excess is at least `kernel_share` of a step it holds up."""
        calls = [c for c in ctx.views.rows("cpu_call_excess") if c["rank"] == rk]
        top = max(calls, key=lambda c: (c["excess_ns_per_step"], c["name"]), default=None)
        return top if top and top["excess_ns_per_step"] >= self.kernel_share * typical_ns else None

    def _launches(self, ctx: Context, rk: int, typical_ns: int, n_steps: int) -> tuple[float, float] | None:
        """The root's launch gaps (small_gaps) a step and the other ranks' median, when the root's
        exceed that by `kernel_share` of a step it holds up: its CPU launches slower. The median
        leaves the root out: of two ranks, it is the other one's."""
        gaps = ctx.views.by_rank("small_gaps")
        per = sorted(gaps[r.rank]["ns"] if r.rank in gaps else 0 for r in ctx.report.ranks if r.rank != rk)
        if rk not in gaps or not per:
            return None
        own, median = gaps[rk]["ns"] / n_steps, per[len(per) // 2] / n_steps
        return (own, median) if own - median >= self.kernel_share * typical_ns else None

    @staticmethod
    def _fix(ctx: Context, rk: int, phase: str, longer: str = "", late_start: bool = False,
             call: str | None = None, launches: bool = False) -> str:
        if phase == BETWEEN_STEPS_WORK:
            return f"Rank {rk} is late because of work it alone does between steps. " + OTHER_WORK_FIX
        if is_input_range(phase):
            count = _workers(ctx, rk)
            return f"Rank {rk} is late because its `{phase}` is slow: " + count + ctx.data_loader_fix(bool(count))
        if phase != COMPUTE:
            return f"Rank {rk} is late while in `{phase}`: make that range faster on rank {rk} or move it off the step."
        if call:
            return (f"Rank {rk}'s GPU work starts late because its loop thread is in `{call}` each step, which "
                    f"the other ranks are not: find what makes that call on rank {rk} (a sleep, a synchronous "
                    "write or log, a lock; `py-spy dump` or nsys' OS runtime backtraces show the caller) and take "
                    "it out of the step or off the loop thread (a background thread, or every N steps).")
        if launches:
            return (f"Rank {rk} launches the same kernels as the others, slower: its GPU waits between them. Look "
                    f"at what shares rank {rk}'s CPU cores (other processes, its DataLoader workers, a noisy "
                    "neighbour), its NUMA placement and CPU clocks; bind each rank and its workers to the cores "
                    "of its GPU's NUMA node (srun --cpu-bind, numactl). nsys' own per-call cost can land "
                    "unevenly too: time a few steps without the profiler before acting.")
        if late_start:
            return (f"Rank {rk}'s kernels take no longer than the median rank's: its GPU work starts late rather than "
                    f"runs long. Look at the CPU thread that launches it on rank {rk} (host contention, NUMA, its data "
                    "loading workers, Python work between launches); if its launches keep pace, compare its GPU "
                    "clocks (nvidia-smi -q -d CLOCK,PERFORMANCE) and links (PCIe/NVLink) with the others'.")
        if longer:
            return (f"Rank {rk}'s GPU computes more a step than the median rank's ({longer}): find why rank {rk} runs "
                    "these kernels more often or longer (work only it does, other input shapes, another kernel "
                    "choice). " + NO_CAUSE_FIX.format(rk=rk))
        return NO_CAUSE_FIX.format(rk=rk)


def _workers(ctx: Context, rk: int) -> str:
    """How many DataLoader workers would keep rank `rk` fed, in the fix's words, where the run's
    loop marks noted its loader and its workers set its pace (loader_workers.py): with the other
    ranks whose workers set theirs, as the data-loader finding says it (one count for a loader
    they share; the rank's alone would make the next slowest the straggler). The epoch starts of
    a loader whose workers start anew every epoch are the data-loader finding's."""
    restart = {r.rank: r.gaps_by_range_ms.get(START, 0.0) for r in ctx.report.ranks
               if any(s.num_workers and s.persistent_workers is False for s in ctx.report.loaders.get(r.rank, []))}
    few = too_few_workers(ctx, input_idle(ctx), restart)
    return more_workers(few) if rk in few else ""


RULE = Straggler()
