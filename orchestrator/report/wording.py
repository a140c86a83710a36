"""Which rank problems the terminal and the HTML report show, and how; the one-off steps' line
both print.

Partial-rank notes that only say the CUDA tables are absent are expected on a CPU-only
capture and are dropped rather than shown as problems. (The findings' words are the rules'
own: a rule words its fix for a CPU-only capture itself, base.Context.worded.)
"""

from __future__ import annotations

import re

from orchestrator.analyze.measurable import analysed_steps, step_ms
from orchestrator.analyze.model_report import Finding, Problem, Report

# A probe note that the CUDA/CUPTI tables are absent (nsys traced no CUDA).
_UNTRACED = re.compile(r"no (CUPTI_\w+|TARGET_INFO_GPU\w*|GPU_METRICS\w*)(, \w+)* table\(s\): [^;]*")


def problem_reason(report: Report, p: Problem) -> str:
    """The problem's reason without the notes a CPU-only capture makes by design."""
    reason = p.reason or ""
    if report.gpu_activity:
        return reason
    parts = [x.strip() for x in reason.split(";")]
    return "; ".join(x for x in parts if x and not _UNTRACED.fullmatch(x))


def split_problems(report: Report) -> tuple[list[tuple[Problem, str]], list[tuple[Problem, str]]]:
    """(problems, notes): failed or missing ranks are problems; a `partial` rank with notes left
    is a note; a partial rank whose only notes are the expected untraced CUDA tables is neither."""
    problems, notes = [], []
    for p in report.problems:
        reason = problem_reason(report, p)
        if p.status == "partial":
            if reason:
                notes.append((p, reason))
        else:
            problems.append((p, reason))
    return problems, notes


def no_gpu_banner(report: Report) -> str:
    """What a report without GPU activity says it is: a CPU-only capture, or a capture whose GPU
    trace was lost (the ranks launched GPU work, or some rank kept its kernels; metrics/sql/15_gpu_lost.sql)."""
    lost = report.outcome.gpu_lost if report.outcome is not None else []
    if lost:
        return (f"GPU trace lost on rank(s) {', '.join(map(str, lost))} (its kernels never reached nsys; "
                "the job outcome says why)")
    return "CPU-only capture (no GPU activity traced: a CPU run, or CUDA tracing off)"


def cost(f: Finding) -> str:
    """A finding's cost as the terminal and the HTML word it ("" for one that costs nothing
    measured: an outcome, a memory risk, a note), from the finding's own numbers."""
    if f.cost_ms <= 0:
        return ""
    share = f", {f.cost_pct:g}% of the steps' time" if f.cost_pct is not None else ""
    err = f" ± {f.unprofiled_err_ms:,.1f}" if f.unprofiled_err_ms else ""  # nsys' estimate's standard error
    bare = f" (about {f.unprofiled_ms:,.1f}{err} ms without the profiler)" if f.unprofiled_ms is not None else ""
    return f"fixing it saves ~{f.cost_ms:,.1f} ms{share}{bare}"


def oneoff_steps_line(report: Report, shown: int = 3) -> str | None:
    """The analysed steps that are one-off (over 3x the median and no pattern: view
    analysed_steps), whose idle no finding's cost counts; None without any."""
    once = [s for s in analysed_steps(report) if s.oneoff]
    if not once:
        return None
    more = f" and {len(once) - shown} more" if len(once) > shown else ""
    return "one-off, left out of the costs: step " + ", ".join(
        f"{s.step} ({step_ms(s):,.1f} ms)" for s in once[:shown]) + more
