"""Render-time wording shared by the terminal and the HTML report.

The rules write their fixes for GPU jobs ("Feed the GPU ahead of time"). On a CPU-only
capture (`Report.gpu_activity` false) that advice reads as a bug, so the renderers reword
the known GPU phrases for the CPU case. Until the rules carry CPU variants of their fix texts
this is the one place that knows them. Partial-rank notes that only say the CUDA tables are
absent are expected on a CPU-only capture and are dropped rather than shown as problems.
"""

from __future__ import annotations

import re

from orchestrator.analyze.model import Problem, Report

_CPU_PHRASES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"Feed the GPU ahead of time: "), "Have each batch ready before the step needs it: "),
    (re.compile(r", copy with \.to\(device, non_blocking=True\)"), ""),
    (re.compile(r"The GPU idles while the CPU runs this range: "),
     "The other ranks wait in their collectives while this rank runs this range: "),
    (re.compile(r"\bGPU idle\b"), "idle"),
]
# A probe note that the CUDA/CUPTI tables are absent (nsys traced no CUDA).
_UNTRACED = re.compile(r"no (CUPTI_\w+|TARGET_INFO_GPU\w*|GPU_METRICS\w*)(, \w+)* table\(s\): [^;]*")


def fix_text(report: Report, text: str) -> str:
    """A finding's fix (or title, evidence) worded for the capture: unchanged when it has GPU work."""
    if report.gpu_activity:
        return text
    for pat, repl in _CPU_PHRASES:
        text = pat.sub(repl, text)
    return text


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
