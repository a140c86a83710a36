"""`orch diff A B`: per-rank and per-metric deltas between two reports, for CI gates, and A's
findings checked against what B measured (findings_diff.py).

A metric regresses when it moves the bad way by more than its threshold: absolute points
for percentages, relative change for times. Exit status 1 on any regression.

Where B runs the same loop faster (its pace, measurable.pace, at least STEP_FASTER below A's and
beyond what the steps vary by themselves), what is measured in time does not regress: a fix
shortens the steps, so fixed costs (the all-reduce, a launch gap) take a larger share of them,
and the rank that no longer holds the others up now waits for them like the rest. Those rows are
still shown, marked; memory and bandwidth are no share of the step and still regress.
"""

from __future__ import annotations

from typing import Any

from orchestrator.analyze.measurable import pace_gap_floor, paces
from orchestrator.analyze.model_columns import Diff, diff_columns
from orchestrator.analyze.model_report import RankMetrics, Report
from orchestrator.report.comm_diff import comm_rows
from orchestrator.report.critical_diff import critical_rows, replay_lines
from orchestrator.report.findings_diff import findings_check
from orchestrator.report.memory_diff import memory_rows

# The per-rank metrics and their thresholds are declared on RankMetrics' fields (model_columns.Diff).
METRICS: dict[str, Diff] = dict(diff_columns(RankMetrics))
# Relative changes below this many ms are noise whatever their percentage.
MIN_ABS_MS = 1.0
# B is faster when its pace is this much below A's (mean_step_ms' own threshold), and beyond noise.
STEP_FASTER = METRICS["mean_step_ms"].threshold


def _value(r: RankMetrics, metric: str) -> float:
    v = getattr(r, metric)
    missing = METRICS[metric].missing
    if v is None and missing is not None:
        return missing(r)
    return float(v or 0.0)


def diff_reports(a: Report, b: Report, scale: float = 1.0) -> dict[str, Any]:
    """Deltas from A (baseline) to B (candidate); `scale` multiplies every threshold."""
    ra = {r.rank: r for r in a.ranks}
    rb = {r.rank: r for r in b.ranks}
    per_rank = []
    for rank in sorted(set(ra) & set(rb)):
        for metric, m in METRICS.items():
            va, vb = _value(ra[rank], metric), _value(rb[rank], metric)
            delta = vb - va
            bad = delta if m.worse_up else -delta
            if m.kind == "points":
                regressed = bad > m.threshold * scale
            else:
                regressed = bad > MIN_ABS_MS and va > 0 and bad / va > m.threshold * scale
            per_rank.append({"rank": rank, "metric": metric, "a": round(va, 3), "b": round(vb, 3),
                             "delta": round(delta, 3), "regressed": regressed})
    held = [*comm_rows(a, b, scale), *memory_rows(a, b, scale)]  # bandwidth per kind and size; memory
    path = critical_rows(a, b, scale)  # bubble, critical-path composition and roots
    change = pace_change(a, b, scale)
    for row in [*per_rank, *path]:
        row["faster"] = bool(change and change["faster"] and row["regressed"])
        row["regressed"] = row["regressed"] and not row["faster"]
    for row in held:
        row["faster"] = False
    rows = [*per_rank, *held, *path]
    return {"rows": rows, "regressions": [r for r in rows if r["regressed"]], "pace": change,
            "only_in_a": sorted(set(ra) - set(rb)), "only_in_b": sorted(set(rb) - set(ra)),
            "findings": findings_check(a, b), "replay": replay_lines(a, b)}


def pace_change(a: Report, b: Report, scale: float = 1.0) -> dict[str, Any] | None:
    """The two runs' paces (the steps one-off in either left out), the smallest difference the
    steps' own variation lets through, and whether B is faster (see the module docstring); None
    where a run has no analysed complete step."""
    both = paces(a, b)
    if both is None:
        return None
    pa, pb = both
    floor = pace_gap_floor(pa, pb)
    gain = pa.mean_ms - pb.mean_ms
    return {"a_ms": round(pa.mean_ms, 3), "b_ms": round(pb.mean_ms, 3),
            "change_pct": round(100 * (pb.mean_ms / pa.mean_ms - 1), 1) if pa.mean_ms > 0 else None,
            "noise_ms": None if floor is None else round(floor, 3),
            "faster": floor is not None and gain > floor and gain > STEP_FASTER * scale * pa.mean_ms}


def pace_line(d: dict[str, Any]) -> str | None:
    """What the terminal says of the rows B's faster pace keeps from regressing, or None."""
    change, moved = d.get("pace"), [r for r in d["rows"] if r.get("faster")]
    if not change or not change["faster"] or not moved:
        return None
    return (f"B is faster: a step {change['a_ms']:,.3f} -> {change['b_ms']:,.3f} ms ({change['change_pct']:+.1f} %, "
            f"beyond the steps' own variation of {change['noise_ms']:,.3f} ms); the {len(moved)} rise(s) marked "
            "`B faster` are shares and waits of the shorter steps, not regressions (memory and bandwidth still are)")
