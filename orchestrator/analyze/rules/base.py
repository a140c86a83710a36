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
from dataclasses import dataclass, field
from typing import ClassVar

from orchestrator.analyze.engine import Options, Views
from orchestrator.analyze.model import Finding, Report, Severity

# NVTX range names that are the input pipeline in real code.
DATA_RANGE = re.compile(r"data|load|batch|input|fetch|collate|sampler|prefetch", re.I)

DATA_LOADER_FIX = (
    "Feed the GPU ahead of time: DataLoader(num_workers>0, pin_memory=True, prefetch_factor>=2, "
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


# What an OS runtime call the loop thread sat in says about the CPU side.
_CALL_MEANING = [
    (re.compile(r"pthread_cond|poll|select|epoll|sem_|futex|recv|accept|pthread_join", re.I),
     "blocked waiting (e.g. on the DataLoader workers' queue or a lock)"),
    (re.compile(r"^(p?read|fread|open|stat|lseek)", re.I), "reading files"),
    (re.compile(r"sleep", re.I), "sleeping"),
]


def cpu_state(ctx: Context, rank: int, groups: Callable[[str], bool]) -> str | None:
    """One evidence line: what the rank's loop thread did during its GPU gaps in the range
    groups `groups` accepts (view gap_cpu, from the OS runtime trace), or None when the OS
    runtime was not traced or nothing was found."""
    rows = [r for r in ctx.views.rows("gap_cpu") if r["rank"] == rank and groups(r["range_group"])]
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


def ns_to_ms(ns: float | int | None) -> float:
    """ns -> ms, rounded to the µs the report shows (the only arithmetic rules do on metrics)."""
    return round((ns or 0) / 1e6, 3)


def severity_for(pct_of_window: float) -> Severity:
    """Severity in proportion to cost: the share of the window the problem costs."""
    if pct_of_window >= 20:
        return "high"
    if pct_of_window >= 5:
        return "medium"
    return "low" if pct_of_window >= 1 else "info"


def finding(kind: str, ranks: Iterable[int], title: str, evidence: list[str], fix: str, cost_ms: float,
            *, pct: float | None = None, severity: Severity | None = None,
            victims: Iterable[int] = ()) -> Finding:
    """The one way a rule makes a finding: severity from `pct` (of the window) unless given."""
    if severity is None:
        severity = severity_for(pct or 0.0)
    return Finding(kind=kind, severity=severity, ranks=sorted(set(ranks)), title=title, evidence=evidence,
                   fix=fix, cost_ms=round(cost_ms, 3), victims=sorted(set(victims)))


@dataclass
class Context:
    views: Views
    report: Report
    opts: Options
    findings: list[Finding] = field(default_factory=list)

    def window_ms(self) -> dict[int, float]:
        return {r.rank: r.window_ms for r in self.report.ranks}


@dataclass
class Rule:
    kind: ClassVar[str]
    reads: ClassVar[tuple[str, ...]] = ()
    final: ClassVar[bool] = False
    symptom: ClassVar[bool] = False  # names when/where time is lost, not why: ranked after causes

    def evaluate(self, ctx: Context) -> list[Finding]:
        raise NotImplementedError
