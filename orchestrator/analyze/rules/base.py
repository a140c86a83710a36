"""What every rule shares: the context it reads, one Finding constructor, severity by cost.

A rule is one module in this package defining `RULE`, an instance of a `Rule` subclass whose
thresholds are documented dataclass fields. It reads named views (`ctx.views.rows("...")`,
listed in `reads`) and the metrics already in the report (`ctx.report`), and returns zero or
more `Finding`s built with `finding(...)`. Rules with `final = True` run after the others and
see their findings (e.g. `healthy`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
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
CPU_GAP_FIX = (
    "The GPU idles while the CPU runs this range: move the work off the critical path "
    "(overlap it with GPU work, do it asynchronously or less often) or make it faster."
)


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

    def evaluate(self, ctx: Context) -> list[Finding]:
        raise NotImplementedError
