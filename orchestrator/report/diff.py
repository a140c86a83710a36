"""`orch diff A B`: per-rank and per-metric deltas between two reports, for CI gates, and A's
findings checked against what B measured (findings_diff.py).

A metric regresses when it moves the bad way by more than its threshold: absolute points
for percentages, relative change for times. Exit status 1 on any regression.
"""

from __future__ import annotations

from typing import Any

from orchestrator.analyze.model_columns import Diff, diff_columns
from orchestrator.analyze.model_report import RankMetrics, Report
from orchestrator.report.comm_diff import comm_rows
from orchestrator.report.critical_diff import critical_rows
from orchestrator.report.findings_diff import findings_check
from orchestrator.report.memory_diff import memory_rows

# The per-rank metrics and their thresholds are declared on RankMetrics' fields (model_columns.Diff).
METRICS: dict[str, Diff] = dict(diff_columns(RankMetrics))
# Relative changes below this many ms are noise whatever their percentage.
MIN_ABS_MS = 1.0


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
    rows, regressions = [], []
    for rank in sorted(set(ra) & set(rb)):
        for metric, m in METRICS.items():
            va, vb = _value(ra[rank], metric), _value(rb[rank], metric)
            delta = vb - va
            bad = delta if m.worse_up else -delta
            if m.kind == "points":
                regressed = bad > m.threshold * scale
            else:
                regressed = bad > MIN_ABS_MS and va > 0 and bad / va > m.threshold * scale
            row = {"rank": rank, "metric": metric, "a": round(va, 3), "b": round(vb, 3),
                   "delta": round(delta, 3), "regressed": regressed}
            rows.append(row)
            if regressed:
                regressions.append(row)
    for row in [*comm_rows(a, b, scale), *memory_rows(a, b, scale),  # bandwidth per kind and size; memory
                *critical_rows(a, b, scale)]:  # bubble, critical-path composition and roots
        rows.append(row)
        if row["regressed"]:
            regressions.append(row)
    return {"rows": rows, "regressions": regressions,
            "only_in_a": sorted(set(ra) - set(rb)), "only_in_b": sorted(set(rb) - set(ra)),
            "findings": findings_check(a, b)}
