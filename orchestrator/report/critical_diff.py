"""Pipeline and critical-path rows of `orch diff`: the bubble per stage (and its excess over the
schedule's theory), what the critical path is made of, how much each root rank put on it per
step, and how far each run's replay is from its trace, A vs B. A run that got slower says here
whether its bubble grew, who holds it up now, and doing what (a new root is a rank with nothing
in A)."""

from __future__ import annotations

from typing import Any

from orchestrator.analyze.model_report import Report

BUBBLE_POINTS = 5.0  # bubble (or its excess) up by more than this many points regresses
SHARE_POINTS = 10.0  # a non-compute part of the critical path up by more than this many points
ROOT_REL, ROOT_MIN_MS = 0.25, 1.0  # a root's excess per step up by 25 % and 1 ms


def _row(metric: str, va: float, vb: float, regressed: bool) -> dict[str, Any]:
    return {"rank": "all", "metric": metric, "a": round(va, 3), "b": round(vb, 3), "delta": round(vb - va, 3),
            "regressed": regressed}


def _shares(r: Report) -> dict[str, float]:
    return r.critical_path.composition_pct if r.critical_path else {}


def _per_step(r: Report) -> dict[int, float]:
    return {h.rank: h.ms_per_step for h in r.critical_path.held_by} if r.critical_path else {}


def critical_rows(a: Report, b: Report, scale: float = 1.0) -> list[dict[str, Any]]:
    """Rows for stages present in both, path parts and roots present in either."""
    out = []
    sa = {s.stage: s for s in a.stages}
    for s in b.stages:
        o = sa.get(s.stage)
        if o is None:
            continue
        out.append(_row(f"bubble stage {s.stage} %", o.bubble_pct, s.bubble_pct,
                        s.bubble_pct - o.bubble_pct > BUBBLE_POINTS * scale))
        if o.excess_bubble_pct is not None and s.excess_bubble_pct is not None:
            out.append(_row(f"bubble stage {s.stage} above theory %", o.excess_bubble_pct, s.excess_bubble_pct,
                            s.excess_bubble_pct - o.excess_bubble_pct > BUBBLE_POINTS * scale))
    ca, cb = _shares(a), _shares(b)
    for what in sorted(set(ca) | set(cb)):
        va, vb = ca.get(what, 0.0), cb.get(what, 0.0)
        out.append(_row(f"critical path: {what} %", va, vb, what != "GPU compute" and vb - va > SHARE_POINTS * scale))
    if a.replay and b.replay:  # how far each replay is from its trace: a what-if is no surer than this
        out.append(_row("replay error %", a.replay.error_pct, b.replay.error_pct, False))
    ra, rb = _per_step(a), _per_step(b)
    for rk in sorted(set(ra) | set(rb)):
        va, vb = ra.get(rk, 0.0), rb.get(rk, 0.0)
        grew = vb - va
        out.append(_row(f"critical-path root rank {rk}: excess ms/step", va, vb,
                        grew > ROOT_MIN_MS and (va == 0 or grew / va > ROOT_REL * scale)))
    return out


def replay_lines(a: Report, b: Report) -> list[str]:
    """Each run's replay of its unchanged trace, in words (`Replay.line`), always shown: the table
    keeps only rows that moved, and a what-if in either run is no surer than its replay. None for
    two runs neither of which was replayed (one GPU, a CPU job: no cross-rank graph)."""
    if a.replay is None and b.replay is None:
        return []
    return [f"{side}: {r.replay.line if r.replay else 'not replayed (no NCCL work matched across ranks)'}"
            for side, r in (("A", a), ("B", b))]
