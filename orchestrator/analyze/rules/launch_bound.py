"""Many tiny kernels separated by launch gaps: the CPU cannot launch fast enough."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.measurable import analysed_steps
from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.allocator_churn import RULE as ALLOCATOR
from orchestrator.analyze.rules.base import Context, Rule, finding, launch_gaps, overhead_error_ms, severity_for
from orchestrator.analyze.units import ms

FIX = ("The GPU waits on kernel launches: capture steady-state steps with CUDA graphs "
       "(torch.cuda.graphs / torch.compile(mode='reduce-overhead')), fuse small ops "
       "(torch.compile), or grow the per-kernel work (batch size).")
# A loop that already replays CUDA graphs (graph_usage): what is left is outside them.
FIX_GRAPHS = ("The GPU waits on the kernels launched outside the CUDA graphs this loop already replays: "
              "capture them too (the optimizer step, gradient clipping, loss and metrics), fuse the small "
              "eager ops (torch.compile), or grow the per-kernel work (batch size).")
# A loop compiled already (torch.compile without CUDA graphs): most of its kernels are Inductor's
# Triton kernels. Fusing is done; what is left is the launches and the ops outside the graphs.
FIX_COMPILED = ("The GPU waits on kernel launches, and the loop already runs torch.compile's fused kernels: "
                "compile it with mode='reduce-overhead' (CUDA graphs replay the compiled kernels at once), bring "
                "the optimizer step and gradient clipping into the compiled or captured region, check for graph "
                "breaks that leave ops eager (TORCH_LOGS=graph_breaks), or grow the per-kernel work (batch size).")
# Inductor's kernels of a rank at least this share of its kernels: the loop is compiled.
COMPILED_SHARE = 0.25
# Every rank's launch gaps are within nsys' estimated per-call cost.
FIX_PROFILER = ("Nothing to change for launch overhead yet: the launch gaps in this capture are within what "
                "tracing every CUDA call added, by its estimate. Time a few steps without nsys (the loop's own "
                "step timer) before acting; adopt CUDA graphs or torch.compile only if the unprofiled step is "
                "still longer than its GPU work a step (its evidence gives it).")


@dataclass
class LaunchBound(Rule):
    kind = "launch_bound"
    explains_idle = True
    reads = ("kernel_stats", "small_gaps", "alloc_gaps", "graph_usage", "capture_overhead", "kernel_origins")
    max_median_ns: int = 20_000  # kernels shorter than this (median) are "tiny"
    min_per_step: int = 200  # kernels per step
    min_share: float = 0.1  # sub-threshold gaps as a share of the window
    # nsys's per-call cost lengthens every launch: where the estimate explains this share of the
    # launch gaps, the finding says so and counts only the rest as the loop's own cost.
    temper_share: float = 0.25
    # A rank whose kernels match a launch-bound rank's (count within this share, median within
    # same_median_share) runs the same loop. Where its own gaps fall within nsys' share and its GPU
    # waited in collectives at least min_share of the window, it waited there for that rank's
    # launches instead of its own: the loop's fix speeds both.
    same_count_share: float = 0.01
    same_median_share: float = 0.1

    def _many_gaps(self, ns: float, window_ms: float) -> bool:
        """Sub-threshold gaps worth a finding: at least min_share of the window."""
        return ms(ns) >= self.min_share * window_ms

    def evaluate(self, ctx: Context) -> list[Finding]:
        win = ctx.window_ms()
        # The gaps that device allocations and frees fill on a churning rank are the allocator
        # churn finding's (one delay counted once).
        churn = {r.rank for r in ALLOCATOR.churning(ctx)}
        alloc = {rk: g for rk, g in ctx.views.by_rank("alloc_gaps").items() if rk in churn and g["small_n"]}
        small = launch_gaps(ctx, churn)
        hit = []
        for k in ctx.views.rows("kernel_stats"):
            rk, sg = k["rank"], small.get(k["rank"])
            per_step = k["n"] / max(1, k["n_steps"])
            if (sg and win.get(rk) and k["median_ns"] < self.max_median_ns and per_step >= self.min_per_step
                    and self._many_gaps(sg["ns"], win[rk])):
                hit.append((rk, k, sg))
        if not hit:
            return []
        over = ctx.views.by_rank("capture_overhead")
        nsys = {rk: min(over[rk]["est_ns"], sg["ns"]) for rk, _, sg in hit
                if rk in over and over[rk]["est_ns"] >= self.temper_share * sg["ns"]}
        own = {rk: sg["ns"] - nsys.get(rk, 0) for rk, _, sg in hit}
        # A rank whose gaps left after nsys' share would not have passed min_share is not
        # launch-bound by the loop's own doing: advising CUDA graphs there would chase the profiler.
        real = [rk for rk in own if self._many_gaps(own[rk], win[rk])]
        evidence = [f"rank {rk}: {k['n']} kernels (median {k['median_ns'] / 1e3:.1f} us), "
                    f"{sg['n']} sub-threshold gaps totalling {ms(sg['ns'])} ms"
                    + (f" (and {alloc[rk]['small_n']} more, {ms(alloc[rk]['small_ns'])} ms, that device allocations "
                       "and frees fill: the allocator churn finding's)" if rk in alloc else "")
                    for rk, k, sg in hit]
        err = {rk: overhead_error_ms(over[rk], ms(ns)) for rk, ns in nsys.items()}
        evidence += [f"rank {rk}: ≈ {ms(ns)} ms of those gaps is nsys' own per-call cost (estimated from "
                     f"{over[rk]['api_calls']} traced CUDA calls; standard error {round(err[rk], 3)} ms, the "
                     "estimate's calibration): without the profiler the loop is less launch-bound than it looks "
                     "here" for rk, ns in sorted(nsys.items())]
        if not real:
            return [finding(self.kind, own, "launch gaps within what the profiler itself added",
                            evidence + self._gpu_work(ctx, sorted(own)), FIX_PROFILER, 0.0, severity="info")]
        wait = {r.rank: r.exposed_wait_ms for r in ctx.report.ranks}
        same = [(rk, of, k) for rk, of, k in self._same_loop(hit, real)
                if self._many_gaps(wait.get(rk, 0.0) * 1e6, win[rk])]
        if same:
            evidence += [f"rank {rk}: the same kernels as launch-bound rank {of} ({k['n']}, median "
                         f"{k['median_ns'] / 1e3:.1f} us): the same loop; its GPU waited "
                         f"{wait.get(rk) or 0.0} ms in collectives not overlapped with compute, for its peers' "
                         "launches, where its own launch gaps would show" for rk, of, k in same]
            real += [rk for rk, _, _ in same]
        # The saving is this capture's (what the replay of it, or its twin captured with the fix,
        # shows: the fix removes nsys' per-call cost with the calls); the severity is the loop's
        # own share, what is left without the profiler.
        gaps = {rk: ms(small[rk]["ns"]) for rk in real}
        mine = max(real, key=lambda rk: own[rk])
        unprofiled = ms(own[mine])
        if unprofiled < max(gaps.values()):
            evidence.append(f"without the profiler the fix saves about {unprofiled} ms (the gaps less nsys' "
                            "estimated share)")
        left = sorted(own.keys() - set(real))
        if left:
            evidence.append(f"rank(s) {', '.join(map(str, left))}: the gaps left after nsys' share are under "
                            f"{round(100 * self.min_share)} % of the window: not launch-bound without the profiler")
        graphs = {r["rank"] for r in ctx.views.rows("graph_usage")} & set(real)
        compiled = self._compiled(ctx, real)
        evidence += [f"rank {rk}: {n:,} of its {total:,} kernels ({round(100 * n / total)}%) are Inductor's "
                     "generated Triton kernels: the loop runs torch.compile already" for rk, (n, total) in compiled]
        fix = FIX_GRAPHS if graphs else FIX_COMPILED if compiled else FIX
        return [finding(
            self.kind, real, "many tiny kernels with launch gaps between them", evidence,
            fix, max(gaps.values()), pct=max(100 * gaps[rk] / win[rk] for rk in real),
            severity=severity_for(max(100 * ms(own[rk]) / win[rk] for rk in real)),
            unprofiled_ms=unprofiled if unprofiled < max(gaps.values()) else None,
            unprofiled_err_ms=err[mine] if nsys.get(mine) else None)]

    @staticmethod
    def _compiled(ctx: Context, ranks: list[int]) -> list[tuple[int, tuple[int, int]]]:
        """(rank, (Inductor's kernels, all kernels)) of each of `ranks` whose kernels in the window
        are COMPILED_SHARE or more Inductor's (view kernel_origins: torch.compile's)."""
        got = ctx.views.by_rank("kernel_origins")
        return [(rk, (got[rk]["generated"], got[rk]["kernels"])) for rk in sorted(ranks)
                if rk in got and got[rk]["kernels"] and got[rk]["generated"] >= COMPILED_SHARE * got[rk]["kernels"]]

    @staticmethod
    def _gpu_work(ctx: Context, ranks: list[int]) -> list[str]:
        """What an unprofiled step timing is held to: each rank's GPU work a step."""
        n = len(analysed_steps(ctx.report))
        if not n:
            return []
        return [f"rank {r.rank}: its GPU works {round(r.gpu_busy_ms / n, 3)} ms a step ({r.gpu_busy_ms} ms over "
                f"{n} analysed steps), and its median step takes {r.median_step_ms} ms under nsys: a step timed "
                f"without nsys longer than {round(r.gpu_busy_ms / n, 3)} ms is the loop's own launch or CPU time"
                for r in ctx.report.ranks if r.rank in ranks and r.median_step_ms]

    def _same_loop(self, hit: list[tuple[int, dict, dict]], real: list[int]) -> list[tuple[int, int, dict]]:
        """(rank, the launch-bound rank it matches, its kernel_stats row) for each rank of `hit`
        not in `real` that launches the kernels of a rank in `real`: as many a step, as short."""
        stats = {rk: k for rk, k, _ in hit}
        out = []
        for rk, k, _ in hit:
            if rk in real:
                continue
            for of in real:
                o = stats[of]
                if (k["n_steps"] == o["n_steps"] and abs(k["n"] - o["n"]) <= self.same_count_share * o["n"]
                        and abs(k["median_ns"] - o["median_ns"]) <= self.same_median_share * o["median_ns"]):
                    out.append((rk, of, k))
                    break
        return out


RULE = LaunchBound()
