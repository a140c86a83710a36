"""What every rule shares: the context it reads, one Finding constructor, severity by cost.

A rule is one module in this package defining `RULE`, an instance of a `Rule` subclass whose
thresholds are documented dataclass fields. It reads named views (`ctx.views.rows("...")`,
listed in `reads`) and the metrics already in the report (`ctx.report`), and returns zero or
more `Finding`s built with `finding(...)`. Rules with `final = True` run after the others and
see their findings (e.g. `healthy`); rules with `symptom = True` rank after the causes of the
same severity.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, TypeVar

from orchestrator.analyze.model_report import Finding, Report, Severity
from orchestrator.analyze.units import ms
from orchestrator.metrics.engine import CALL_GAP, Options, Views

# NVTX range names that are the input pipeline in real code.

# The data-loader fix's advice on the worker count, left out where the fix already names how many
# workers would keep up (loader_workers.more_workers).
WORKERS_ARG = "num_workers>0, "
DATA_LOADER_FIX = (
    f"Feed the GPU ahead of time: DataLoader({WORKERS_ARG}pin_memory=True, prefetch_factor>=2, "
    "persistent_workers=True), copy with .to(device, non_blocking=True), and move decoding/"
    "augmentation out of the training loop."
)
BETWEEN_STEPS_WORK = "between steps (other work)"
OTHER_WORK_FIX = (
    "Between steps this rank's loop synchronises with the GPU or launches other work (per-step metrics, "
    "logging, evaluation, checkpoints: `.item()`, `.cpu()`, eval batches): keep metrics on the GPU and read "
    "them every N steps, run evaluation less often or on all ranks at the same step, and save "
    "checkpoints asynchronously (torch.distributed.checkpoint.async_save)."
)
CPU_GAP_FIX = (
    "The GPU idles while the CPU runs this range: move the work off the critical path "
    "(overlap it with GPU work, do it asynchronously or less often) or make it faster."
)
# The same advice for a CPU-only capture (no GPU traced): there the others wait in collectives,
# and advice about feeding a GPU reads as a bug.
DATA_LOADER_FIX_CPU = (
    f"Have each batch ready before the step needs it: DataLoader({WORKERS_ARG}pin_memory=True, "
    "prefetch_factor>=2, persistent_workers=True), and move decoding/augmentation out of the training loop."
)
CPU_GAP_FIX_CPU = (
    "The other ranks wait in their collectives while this rank runs this range: move the work off the critical "
    "path (overlap it with GPU work, do it asynchronously or less often) or make it faster."
)


# What an OS runtime call the loop thread sat in says about the CPU side.
_CALL_MEANING = [
    (re.compile(r"pthread_cond|poll|select|epoll|sem_|futex|recv|accept|pthread_join", re.I),
     "blocked waiting (e.g. on the DataLoader workers' queue or a lock)"),
    (re.compile(r"^(p?read|fread|open|stat|lseek)", re.I), "reading files"),
    (re.compile(r"sleep", re.I), "sleeping"),
]


def python_in_gaps(ctx: Context, rank: int, groups: Callable[[str], bool]) -> tuple[str, str, int, int] | None:
    """The Python function orch's sampler found most in the rank's GPU gaps of the range groups
    `groups` accepts (view gap_python): "`function` (file:line)", the same with " in `library
    function` (file:line)" where the samples were in a library under it, its samples and all
    samples in those gaps; None without samples (profile.python_sampling_ms: 0, no nvtx package)."""
    rows = [r for r in ctx.views.of_rank("gap_python", rank) if groups(r["range_group"])]
    total = sum(r["n"] for r in rows)
    if not total:
        return None
    by: dict[str, int] = {}
    leaves: dict[tuple[str, str | None], int] = {}
    for r in rows:
        by[r["func"]] = by.get(r["func"], 0) + r["n"]
        leaves[r["func"], r["leaf"]] = leaves.get((r["func"], r["leaf"]), 0) + r["n"]
    func, n = max(by.items(), key=lambda kv: (kv[1], kv[0]))
    leaf = max((k for k in leaves if k[0] == func), key=lambda k: (leaves[k], k[1] or ""))[1]
    return _function(func), _function(func) + (f" in {_function(leaf)}" if leaf else ""), n, total


def _function(label: str) -> str:
    """`name` (file:line) from the sampler's `name (file:line)`."""
    name, _, where = label.partition(" (")
    return f"`{name}` ({where}" if where else f"`{label}`"


def python_line(rank: int, found: tuple[str, str, int, int]) -> str:
    """python_in_gaps' finding as an evidence line."""
    _, where, n, total = found
    return (f"rank {rank}'s loop thread was in {where} in {n} of the {total} Python samples orch took in that "
            f"idle time ({round(100 * n / total)}%)")


def cpu_state(ctx: Context, rank: int, groups: Callable[[str], bool]) -> str | None:
    """One evidence line: what the rank's loop thread did during its GPU gaps in the range
    groups `groups` accepts (view gap_cpu, from the OS runtime trace), or None when the OS
    runtime was not traced or nothing was found."""
    rows = [r for r in ctx.views.of_rank("gap_cpu", rank) if groups(r["range_group"])]
    total = sum(r["ns"] for r in rows)
    if not total:
        return None
    calls: dict[str | None, float] = {}
    for r in rows:
        calls[r["call"]] = calls.get(r["call"], 0) + r["ns"]
    top, ns = max(calls.items(), key=lambda kv: (kv[1], kv[0] or ""))
    share = round(100 * ns / total)
    if top is None:
        return (f"rank {rank}'s loop thread was running on the CPU ({share}% of that idle time, no blocking OS "
                "call): the loop itself does the work (e.g. DataLoader num_workers=0, decoding or augmentation "
                "in the training process)")
    meaning = next((m for rx, m in _CALL_MEANING if rx.search(top)), "in an OS call")
    return f"rank {rank}'s loop thread was in `{top}` for {share}% of that idle time: {meaning}"


T = TypeVar("T")


@dataclass(frozen=True)
class OneOff:
    """A rank's GPU idle that recurs in no other step (oneoff_gaps), in ms by range: in its
    one-off steps (a step over 3x its median, such as torch.compile's graph recording or DDP's
    first bucket rebuild) and in a one-time initialisation in any other step (NCCL creating a
    communicator, CUDA loading a module). A fix of the loop's own pattern won't save it."""

    by_range: dict[str, float]
    steps: dict[int, tuple[float, float]]  # step -> (its ms, the rank's median step ms)
    inits: dict[str, tuple[float, list[int]]]  # an initialisation's gap group -> (its ms, the steps it fell in)

    @property
    def total_ms(self) -> float:
        return sum(self.by_range.values())

    def line(self, rank: int, what: float) -> str:
        """The long steps' line: `what` ms of them left out."""
        shown = ", ".join(f"step {s} ({round(ns, 1)} ms against a median {round(med, 1)} ms)"
                          for s, (ns, med) in sorted(self.steps.items()))
        return (f"rank {rank}: {round(what, 3)} ms more fell in {shown}, a one-off (warm-up, graph recording, a "
                "checkpoint) that no other step repeats: left out of the cost")

    def lines(self, rank: int, name: str | None = None) -> list[str]:
        """What was left out of a gap group's cost (of every group's where `name` is None)."""
        names = sorted(self.by_range) if name is None else [name]
        inits = [n for n in names if n in self.inits]
        steps = sum(self.by_range.get(n, 0.0) - self.inits.get(n, (0.0, []))[0] for n in names)
        out = [self.line(rank, steps)] if self.steps and steps > 0 else []
        return out + [
            f"rank {rank}: {round(self.inits[n][0], 3)} ms more fell while the loop thread was in "
            f"`{n.removeprefix(CALL_GAP)}` (step {', '.join(map(str, self.inits[n][1]))}), a one-time initialisation "
            "(NCCL creates a communicator at a group's first collective, CUDA loads a module at a kernel's first "
            "launch): left out of the cost" for n in inits]


def one_offs(ctx: Context) -> dict[int, OneOff]:
    """Each rank's one-off idle; the rule must read `oneoff_gaps`."""
    out: dict[int, OneOff] = {}
    for r in ctx.views.rows("oneoff_gaps"):
        o = out.setdefault(r["rank"], OneOff({}, {}, {}))
        ms = float(r["ns"]) / 1e6
        o.by_range[r["range_group"]] = o.by_range.get(r["range_group"], 0.0) + ms
        if r["init"]:
            total, steps = o.inits.get(r["range_group"], (0.0, []))
            o.inits[r["range_group"]] = (total + ms, [*steps, r["step"]])
        else:
            o.steps[r["step"]] = (r["step_ns"] / 1e6, r["median_ns"] / 1e6)
    return out


@dataclass(frozen=True)
class GraphEager:
    """A rank's GPU idle in the steps of a loop that keeps recording CUDA graphs that run the
    model eagerly, to warm up or record a new shape's graph (graph_eager_gaps), in ms by range:
    the recording's idle, which the cuda_graphs finding costs."""

    by_range: dict[str, float]
    steps: frozenset[int]

    def lines(self, rank: int, name: str) -> list[str]:
        ms = self.by_range.get(name, 0.0)
        return [f"rank {rank}: {round(ms, 3)} ms more fell in the {len(self.steps)} steps that warm up or record a "
                "new input shape's CUDA graphs (the cuda_graphs finding's): left out of the cost"] if ms > 0 else []


def graph_eager_steps(ctx: Context) -> dict[int, set[int]]:
    """Each rank's steps that warm up or record a new shape's CUDA graphs, where the loop keeps
    recording them (none elsewhere); the rule must read `graph_eager_steps`."""
    out: dict[int, set[int]] = {}
    for r in ctx.views.rows("graph_eager_steps"):
        out.setdefault(r["rank"], set()).add(r["step"])
    return out


# What each rank's own replay removes (55_own_replay.sql `own_replay.what`).
OWN_SYNCS = "host syncs"
OWN_INPUT = "input"


def own_replay(ctx: Context, what: str) -> dict[int, tuple[float, float]]:
    """Per rank, what replaying its own GPU work with `what` removed saves (ms, never below 0) and
    the CPU time removed (ms): the cost where no replay across ranks gives one; the rule must read
    `own_replay`."""
    return {r["rank"]: (max(0.0, float(r["saving_ns"]) / 1e6), float(r["removed_ns"]) / 1e6)
            for r in ctx.views.rows("own_replay") if r["what"] == what}


def graph_eager(ctx: Context) -> dict[int, GraphEager]:
    """Each rank's idle in its steps that warm up or record CUDA graphs; the rule must read
    `graph_eager_gaps`."""
    by: dict[int, tuple[dict[str, float], set[int]]] = {}
    for r in ctx.views.rows("graph_eager_gaps"):
        ranges, steps = by.setdefault(r["rank"], ({}, set()))
        ranges[r["range_group"]] = ranges.get(r["range_group"], 0.0) + float(r["ns"]) / 1e6
        steps.add(r["step"])
    return {rk: GraphEager(ranges, frozenset(steps)) for rk, (ranges, steps) in by.items()}


def launch_gaps(ctx: Context, churning: set[int]) -> dict[int, dict[str, Any]]:
    """Per rank, its gaps under the gap threshold (small_gaps: count `n`, time `ns`), less on a
    rank in `churning` those device allocations and frees fill (alloc_gaps' small_n, small_ns):
    the launch gaps of the loop's own, launch_bound's cost and allocator churn's usual gap. The
    rule must read `small_gaps` and `alloc_gaps`."""
    alloc = ctx.views.by_rank("alloc_gaps")
    out = {}
    for rk, g in ctx.views.by_rank("small_gaps").items():
        a = alloc.get(rk) if rk in churning else None
        out[rk] = {**g, "n": g["n"] - a["small_n"], "ns": g["ns"] - a["small_ns"]} if a else g
    return out


def overhead_error_ms(row: dict[str, Any], removed_ms: float) -> float:
    """The standard error of `removed_ms` of nsys' estimated cost taken off a rank's idle (its
    `capture_overhead` row): the call term's calibrated error, in proportion where less than the
    whole estimate was taken off (the idle caps it)."""
    est = ms(row["est_ns"])
    return ms(row["est_err_ns"]) * min(1.0, removed_ms / est) if est > 0 else 0.0


def worst_first(by_rank: dict[int, T], cost: Callable[[T], float] = float) -> list[tuple[int, T]]:
    """(rank, value) pairs by `cost(value)`, the highest first (ties: the lower rank): per-rank
    evidence is listed in this order, since a large job's terminal and HTML show a finding's
    first lines only."""
    return sorted(by_rank.items(), key=lambda kv: (-cost(kv[1]), kv[0]))


def severity_for(pct_of_window: float) -> Severity:
    """Severity in proportion to cost: the share of the window the problem costs."""
    if pct_of_window >= 20:
        return "high"
    if pct_of_window >= 5:
        return "medium"
    return "low" if pct_of_window >= 1 else "info"


def finding(kind: str, ranks: Iterable[int], title: str, evidence: list[str], fix: str, cost_ms: float,
            *, pct: float | None = None, severity: Severity | None = None,
            victims: Iterable[int] = (), unprofiled_ms: float | None = None,
            unprofiled_err_ms: float | None = None) -> Finding:
    """The one way a rule makes a finding: severity from `pct` (of the window) unless given."""
    if severity is None:
        severity = severity_for(pct or 0.0)
    return Finding(kind=kind, severity=severity, ranks=sorted(set(ranks)), title=title, evidence=evidence,
                   fix=fix, cost_ms=round(cost_ms, 3), cost_pct=None if pct is None else round(pct, 2),
                   victims=sorted(set(victims)),
                   unprofiled_ms=None if unprofiled_ms is None else round(unprofiled_ms, 3),
                   unprofiled_err_ms=None if unprofiled_ms is None or unprofiled_err_ms is None
                   else round(unprofiled_err_ms, 3))


class DeclaredViews(Views):
    """The views as one rule sees them: those in its `reads`, from the shared cache. A rule
    that reads another fails at once, instead of depending silently on a view nobody checks."""

    def __init__(self, views: Views, rule: Rule) -> None:
        self.con, self._cache, self._grouped, self._rule = views.con, views._cache, views._grouped, rule

    def rows(self, view: str) -> list[dict[str, Any]]:
        if view not in self._rule.reads:
            raise LookupError(f"rule {self._rule.kind} reads view {view!r}, which its `reads` does not list")
        return super().rows(view)


@dataclass
class Context:
    views: Views
    report: Report
    opts: Options
    findings: list[Finding] = field(default_factory=list)

    def for_rule(self, rule: Rule) -> Context:
        """This context with the views limited to what `rule` declares it reads (same findings)."""
        return replace(self, views=DeclaredViews(self.views, rule))

    def window_ms(self) -> dict[int, float]:
        return {r.rank: r.window_ms for r in self.report.ranks}

    def unprofiled(self) -> list[int]:
        """The ranks of the job's world with no report here (profile.ranks chose a few, or
        only some were collected): their peers' collectives have no last starter to wait for."""
        world = self.report.layout.get("world_size")
        if not self.report.layout.get("known") or not isinstance(world, int):
            return []
        return sorted(set(range(world)) - {r.rank for r in self.report.ranks})

    def worded(self, gpu: str, cpu: str) -> str:
        """`gpu` for a capture with GPU work, else its CPU-only wording `cpu`."""
        return gpu if self.report.gpu_activity else cpu

    def data_loader_fix(self, workers_named: bool = False) -> str:
        """The data-loader advice; `workers_named`: the fix before it already says how many workers
        would keep up, so the advice does not say `num_workers>0` after it."""
        text = self.worded(DATA_LOADER_FIX, DATA_LOADER_FIX_CPU)
        return text.replace(WORKERS_ARG, "") if workers_named else text

    def cpu_gap_fix(self) -> str:
        return self.worded(CPU_GAP_FIX, CPU_GAP_FIX_CPU)


@dataclass
class Rule:
    kind: ClassVar[str]
    # The views the rule queries itself (ctx.views; the report's metrics are not listed): the
    # engine lets it read no other (DeclaredViews), tests/test_sql_modules.py checks the list
    # against the rule's code and against the views the SQL modules provide.
    reads: ClassVar[tuple[str, ...]] = ()
    final: ClassVar[bool] = False
    symptom: ClassVar[bool] = False  # names when/where time is lost, not why: ranked after causes
    explains_idle: ClassVar[bool] = False  # says why a rank's GPU idles (gpu_low_util defers to it)
    root: ClassVar[bool] = False  # its findings' ranks hold the others up; `victims` waited for them
    leads: ClassVar[bool] = False  # its findings come before every other (how the job ended)
    summarises: ClassVar[bool] = False  # final, after the other final rules; its findings come last

    def evaluate(self, ctx: Context) -> list[Finding]:
        raise NotImplementedError
