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
    graph_eager,
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
# The samples under torch.save: the loop checkpoints synchronously.
SAVING = "torch/serialization.py"
CHECKPOINT_FIX = (
    "The loop thread saves a checkpoint in {func} while the GPU has nothing queued: torch.save copies every "
    "tensor to the host and writes the file before the loop goes on. Save less often, or asynchronously: "
    "torch.distributed.checkpoint.async_save, or copy the state dicts to pinned CPU memory and write them from a "
    "background thread."
)
# The samples under torch.compile's own runtime (AOTAutograd's wrappers, Dynamo's guards and frame
# evaluation, Inductor's launchers): the compiled code's Python per call, not the user's work.
COMPILE_RUNTIME = ("torch/_functorch/", "torch/_dynamo/", "torch/_inductor/")
COMPILE_RUNTIME_FIX = (
    "The loop thread runs torch.compile's own Python around the compiled code in {func} while the GPU has nothing "
    "queued: its wrappers cost the same at every call, most at small batches. Compile with mode='reduce-overhead' "
    "(CUDA graphs replay the compiled code without most of it), compile larger regions (the whole step, no graph "
    "breaks: TORCH_LOGS=graph_breaks), or give each call more work (a larger per-step batch)."
)
# One function's idle is one cause: the loop thread's states it passes through (Python between
# CUDA calls, then `fopen`, `write`, `fclose` as torch.save writes its file) are merged where at
# least this share of each one's samples is in that function.
ONE_FUNCTION = 0.8
# A function is named as the cause, and costed by its share, only on at least this many samples
# (50 ms of the loop thread's time at orch's default 10 ms): the share of one or two samples is
# 50 or 100 % whatever the thread did, and a thread blocked in a wait is sampled rarely.
MIN_SAMPLES = 5


# A gap while the loop thread waited for another thread of its process, which then launched the
# GPU's next work (40_gaps.sql): the gap is that thread's, and the loop thread's own samples and
# calls say only that it waited.
WAITED = re.compile(re.escape(CALL_GAP) + r"(?P<call>\S+) for (?:the (?P<role>[\w ]+) thread|another thread)$")
BACKWARD_FIX = (
    "The GPU waits for the autograd engine's thread, which runs backward() and launches its kernels while the "
    "loop thread waits in it: in these gaps it launched nothing. Its own CPU work between kernels is the delay "
    "(autograd hooks, custom autograd Functions in Python, a compiled backward's wrapper), or the thread was not "
    "running: give the rank's threads enough CPUs (Slurm --cpus-per-task; OMP_NUM_THREADS and the DataLoader's "
    "workers within them). The thread view (--tables all) shows its calls."
)
OTHER_THREAD_FIX = (
    "The GPU waits for {who}, which launched its next work after these gaps while the loop thread waited for it: "
    "what that thread did before that launch is the delay (the thread view, --tables all, shows its calls), or it "
    "was not running: give the rank's threads enough CPUs (Slurm --cpus-per-task)."
)


def _waited(name: str) -> tuple[str, str] | None:
    """The finding's title and fix for a gap group named after a wait for another thread (whose
    role the name gives; `another thread` where it has none), else None."""
    m = WAITED.match(name)
    if not m:
        return None
    who = f"its {m['role']} thread" if m["role"] else "another of its threads"
    return (f"GPU idle while the loop thread waits in `{m['call']}` for {who}",
            BACKWARD_FIX if m["role"] == "autograd" else OTHER_THREAD_FIX.format(who=who))


def _python_fix(func: str, where: str) -> str:
    """The fix for the loop thread's time in `func` (`where`: it, and the library function under it)."""
    if SAVING in where:
        return CHECKPOINT_FIX.format(func=func)
    return (COMPILE_RUNTIME_FIX if any(r in where for r in COMPILE_RUNTIME) else PYTHON_FIX).format(func=func)


@dataclass
class CpuGap(Rule):
    kind = "cpu_gap"
    explains_idle = True
    # What orch's Python samples found in the gaps; one-off steps' idle; the idle of the steps that
    # warm up or record CUDA graphs in a loop that keeps recording them (cuda_graphs costs it).
    reads = ("gap_python", "oneoff_gaps", "graph_eager_gaps")
    # Reported when the GPU idles in one range for at least this share of a rank's window.
    min_share: float = 0.1

    def evaluate(self, ctx: Context) -> list[Finding]:
        win = ctx.window_ms()
        # A churning rank's gaps in its allocator calls are the allocator churn finding's.
        churn = {r.rank for r in ALLOCATOR.churning(ctx)}
        once, eager = one_offs(ctx), graph_eager(ctx)
        per: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
        for r in ctx.report.ranks:
            for name, ms in r.gaps_by_range_ms.items():
                if not is_input_range(name) and not (r.rank in churn and ALLOC_CALL.match(name)):
                    per[name][r.rank] += ms - (once[r.rank].by_range.get(name, 0.0) if r.rank in once else 0.0) \
                        - (eager[r.rank].by_range.get(name, 0.0) if r.rank in eager else 0.0)
        out = self._by_function(ctx, per, win)
        for name, by_rank in per.items():
            hit = {rk: ms for rk, ms in by_rank.items() if win.get(rk) and ms >= self.min_share * win[rk]}
            if not hit:
                continue
            worst = max(100 * ms / win[rk] for rk, ms in hit.items())
            # Gaps no NVTX range explains are named by the loop thread's call (40_gaps.sql).
            call, waited = name.removeprefix(CALL_GAP), _waited(name)
            title = (f"GPU idle while the CPU is in `{name}`" if call == name
                     else "GPU idle while the loop thread runs Python between CUDA calls"
                     if name == PYTHON else waited[0] if waited else f"GPU idle while the loop thread is in `{call}`")
            evidence = [f"rank {rk}: {round(ms, 3)} ms of GPU gaps >= {ctx.opts.gap_ms} ms in `{name}` "
                        f"({round(100 * ms / win[rk], 1)}% of its window)" for rk, ms in worst_first(hit)]
            evidence += [line for rk in sorted(hit) if rk in once for line in once[rk].lines(rk, name)]
            evidence += [line for rk in sorted(hit) if rk in eager for line in eager[rk].lines(rk, name)]
            fix = OTHER_WORK_FIX if name == BETWEEN_STEPS_WORK else waited[1] if waited else ctx.cpu_gap_fix()
            py = {} if waited else {rk: f for rk in hit if (f := python_in_gaps(ctx, rk, lambda g, n=name: g == n))
                                    and f[3] >= MIN_SAMPLES}
            cost = max(hit.values())
            if py:
                evidence += [python_line(r, found) for r, found in sorted(py.items())[:4]]
                if name == PYTHON:
                    # The fix names the function the samples found most: it saves that function's
                    # share of the idle time, on the rank where that is most.
                    worst_rank = max(py, key=lambda r: hit[r] * py[r][2] / py[r][3])
                    title += f": {py[worst_rank][1]}"
                    fix = ctx.worded(_python_fix(py[worst_rank][0], py[worst_rank][1]), fix)
                    cost = hit[worst_rank] * py[worst_rank][2] / py[worst_rank][3]
                    evidence.append(f"fixing {py[worst_rank][0]} saves its share of rank {worst_rank}'s idle time: "
                                    f"{round(cost, 3)} ms")
            out.append(finding(self.kind, hit, title, evidence, fix, cost, pct=worst))
        return out

    def _by_function(self, ctx: Context, per: dict[str, dict[int, float]], win: dict[int, float]) -> list[Finding]:
        """One finding per Python function that holds most of the samples of two or more of a
        rank's loop-thread gap groups, and MIN_SAMPLES of them together, costed as its share of
        them all together; those groups leave `per`."""
        found: dict[str, dict[int, list[tuple[str, float, tuple[str, str, int, int]]]]] = defaultdict(
            lambda: defaultdict(list))
        for name, by_rank in per.items():
            if name.startswith(CALL_GAP) and not _waited(name):
                for rk, ms in by_rank.items():
                    py = python_in_gaps(ctx, rk, lambda g, n=name: g == n)
                    if py and py[2] >= ONE_FUNCTION * py[3]:
                        found[py[0]][rk].append((name, ms, py))
        out = []
        for func, by_rank in found.items():
            merged = {rk: groups for rk, groups in by_rank.items()
                      if len(groups) >= 2 and sum(py[2] for _, _, py in groups) >= MIN_SAMPLES}
            hit = {rk: sum(ms for _, ms, _ in groups) for rk, groups in merged.items()}
            hit = {rk: ms for rk, ms in hit.items() if win.get(rk) and ms >= self.min_share * win[rk]}
            if not hit:
                continue
            for rk in hit:
                for name, _, _ in merged[rk]:
                    del per[name][rk]
            share = {rk: sum(ms * py[2] / py[3] for _, ms, py in merged[rk]) for rk in hit}
            worst_rank = max(share, key=lambda r: (share[r], -r))
            where = max(merged[worst_rank], key=lambda g: g[1])[2][1]
            states = ", ".join(f"`{n.removeprefix(CALL_GAP)}`" for n, _, _ in merged[worst_rank])
            evidence = [f"rank {rk}: {round(ms, 3)} ms of GPU gaps >= {ctx.opts.gap_ms} ms while its loop thread was "
                        f"in {func} ({round(100 * ms / win[rk], 1)}% of its window): "
                        + ", ".join(f"{round(m, 3)} ms in `{n.removeprefix(CALL_GAP)}`" for n, m, _ in merged[rk])
                        for rk, ms in worst_first(hit)]
            evidence += [python_line(rk, py) for rk in sorted(hit)[:4] for _, _, py in merged[rk][:1]]
            evidence.append(f"fixing {func} saves its share of rank {worst_rank}'s idle time: "
                            f"{round(share[worst_rank], 3)} ms")
            worst = max(100 * ms / win[rk] for rk, ms in hit.items())
            out.append(finding(self.kind, hit, f"GPU idle while the loop thread runs {where} (in {states})",
                               evidence, ctx.worded(_python_fix(func, where), ctx.cpu_gap_fix()),
                               share[worst_rank], pct=worst))
        return out


RULE = CpuGap()
