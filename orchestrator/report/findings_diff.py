"""The findings part of `orch diff A B`: the profile -> fix -> measure loop closed.

A is the run orch diagnosed, B the same job with a fix. Each of A's findings above `info` is
gone in B (no finding of its kind above `info` there) or still there; B's own above `info` that
A had not are new. What B measured is A's analysed steps at B's pace: the difference of the two
runs' paces (measurable.pace: the slowest rank's mean analysed, complete step) times A's analysed
steps, the steps a finding's saving counts. The steps that are one-off in either run (a
recompile, a communicator's creation: once a run, with the fix or without it) are left out of
both: the two runs are the same loop, step for step. Where one finding costed in time is gone,
its saving is held against that measurement, as the scoreboard holds every real pair
(docs/scoreboard.md); where several are gone, each claims its own idle and the measurement is
held against none alone. Both runs captured alike: the saving under the profiler is the one to
compare (a finding's estimate without the profiler is for an unprofiled run)."""

from __future__ import annotations

from typing import Any

from orchestrator.analyze.measurable import costed_in_time, paces
from orchestrator.analyze.model_report import Finding, Report


def _loud(r: Report) -> list[Finding]:
    return [f for f in r.findings if f.severity != "info"]


def _brief(f: Finding) -> dict[str, Any]:
    return {"kind": f.kind, "severity": f.severity, "ranks": f.ranks, "title": f.title, "cost_ms": f.cost_ms,
            "costed": costed_in_time(f)}


def findings_check(a: Report, b: Report) -> dict[str, Any]:
    """A's findings in B, and B's pace against what they predicted (see the module docstring)."""
    loud_a, loud_b = _loud(a), _loud(b)
    in_b = {f.kind: f for f in reversed(loud_b)}  # the costliest of a kind (findings are sorted)
    in_a = {f.kind for f in loud_a}
    gone = [_brief(f) for f in loud_a if f.kind not in in_b]
    still = [{**_brief(f), "b_severity": in_b[f.kind].severity, "b_cost_ms": in_b[f.kind].cost_ms}
             for f in loud_a if f.kind in in_b]
    new = [_brief(f) for f in loud_b if f.kind not in in_a]
    out: dict[str, Any] = {"gone": gone, "still": still, "new": new, "steps": None, "a_pace_ms": None,
                           "b_pace_ms": None, "measured_ms": None, "predicted_ms": None, "off_pct": None}
    both = paces(a, b)
    if both is None:
        return out
    pa, pb = both
    measured = (pa.mean_ms - pb.mean_ms) * pa.steps
    out.update(steps=pa.steps, a_paced=pa.paced, b_paced=pb.paced, a_pace_ms=round(pa.mean_ms, 3),
               b_pace_ms=round(pb.mean_ms, 3), measured_ms=round(measured, 3))
    costed = [f for f in gone if f["costed"]]
    if len(costed) == 1 and costed[0]["cost_ms"] > 0:
        predicted = costed[0]["cost_ms"]
        out.update(predicted_ms=predicted, off_pct=round(100 * (predicted / measured - 1), 1) if measured > 0 else None)
    return out


def findings_lines(d: dict[str, Any]) -> list[str]:
    """The check as the terminal prints it, one line each."""
    lines = []
    for f in d["gone"]:
        saving = f", predicted saving {f['cost_ms']:,.1f} ms" if f["costed"] else ""
        lines.append(f"gone in B: {f['severity']} {f['kind']} (ranks {f['ranks']}){saving}")
    for f in d["still"]:
        lines.append(f"still in B: {f['kind']}, {f['severity']} {f['cost_ms']:,.1f} ms in A -> "
                     f"{f['b_severity']} {f['b_cost_ms']:,.1f} ms in B")
    for f in d["new"]:
        lines.append(f"new in B: {f['severity']} {f['kind']} (ranks {f['ranks']}), {f['cost_ms']:,.1f} ms")
    if d["measured_ms"] is not None:
        change = f"{abs(d['measured_ms']):,.1f} ms {'less' if d['measured_ms'] >= 0 else 'more'}"
        lines.append(f"measured: A's {d['steps']} analysed steps at B's pace take {change} "
                     f"(a step: {d['a_pace_ms']:,.3f} ms in A, {d['b_pace_ms']:,.3f} ms in B; the mean of "
                     f"{d['a_paced']} and {d['b_paced']} complete steps, the steps one-off in either run left out)")
    if d["predicted_ms"] is not None:
        off = f", {d['off_pct']:+.1f} % off" if d["off_pct"] is not None else ""
        lines.append(f"the fixed finding predicted {d['predicted_ms']:,.1f} ms{off}")
    return lines
