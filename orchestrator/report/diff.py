"""`orch diff A B`: per-rank and per-metric deltas between two reports, for CI gates.

A metric regresses when it moves the bad way by more than its threshold: absolute points
for percentages, relative change for times. Exit status 1 on any regression.
"""

from __future__ import annotations

from typing import Any

from orchestrator.analyze.model import RankMetrics, Report
from orchestrator.report.comm_diff import comm_rows
from orchestrator.report.critical_diff import critical_rows
from orchestrator.report.memory_diff import memory_rows

# metric -> (direction where bigger is worse?, threshold, kind)
METRICS: dict[str, tuple[bool, float, str]] = {
    "gpu_idle_pct": (True, 5.0, "points"),
    "no_compute_pct": (True, 5.0, "points"),
    "comm_overlap_pct": (False, 10.0, "points"),
    "exposed_comm_ms": (True, 0.10, "relative"),
    "compute_ms": (True, 0.10, "relative"),
    "nccl_wait_ms": (True, 0.25, "relative"),
    "p2p_wait_ms": (True, 0.25, "relative"),
    "mean_step_ms": (True, 0.05, "relative"),
    "median_step_ms": (True, 0.05, "relative"),
    "p90_step_ms": (True, 0.10, "relative"),
}
# Relative changes below this many ms are noise whatever their percentage.
MIN_ABS_MS = 1.0


def _value(r: RankMetrics, metric: str) -> float:
    if metric == "mean_step_ms" and r.mean_step_ms is None:  # reports without step statistics
        xs = [s.ms for s in r.step_ms if not s.warmup]
        return sum(xs) / len(xs) if xs else 0.0
    v = getattr(r, metric)
    return float(v or 0.0)


def diff_reports(a: Report, b: Report, scale: float = 1.0) -> dict[str, Any]:
    """Deltas from A (baseline) to B (candidate); `scale` multiplies every threshold."""
    ra = {r.rank: r for r in a.ranks}
    rb = {r.rank: r for r in b.ranks}
    rows, regressions = [], []
    for rank in sorted(set(ra) & set(rb)):
        for metric, (worse_up, thr, kind) in METRICS.items():
            va, vb = _value(ra[rank], metric), _value(rb[rank], metric)
            delta = vb - va
            bad = delta if worse_up else -delta
            if kind == "points":
                regressed = bad > thr * scale
            else:
                regressed = bad > MIN_ABS_MS and va > 0 and bad / va > thr * scale
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
            "only_in_a": sorted(set(ra) - set(rb)), "only_in_b": sorted(set(rb) - set(ra))}
