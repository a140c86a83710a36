"""The timeline's data (analyze/model_timeline.py), read from the analysis views in the same
pass as the report: the per-step times of a CPU-only capture (its steps are NVTX ranges), NCCL
waiting per step, and for two steps the individual kernels, waits and NVTX ranges of a few
ranks (the `Report` holds per-rank totals). Views read: `steps`, `step_gpu`, `comm_ops` (NCCL
kernels), the drawn ranks' GPU work from the event tables (`gpu_work_of`), `compute_islands`,
`nccl_waits` (waiting per NCCL kernel, from `coll` and `p2p_match`), `host_syncs`, the critical
path (`cp_path`, `wait_edges`, `cp_segments`), `nvtx`. A view that is missing is an error: a
renamed view must fail a test, never draw an empty picture.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from orchestrator.analyze.model_report import Report
from orchestrator.analyze.model_timeline import Edge, Extras, Hidden, Lane, PathSeg, Seg, StepView
from orchestrator.analyze.rank_pick import pick_ranks
from orchestrator.analyze.rules import registry
from orchestrator.analyze.units import ms
from orchestrator.metrics import rankpass
from orchestrator.metrics.engine import Views

MAX_LANES = 16  # lanes drawn per step; the other ranks are summarised in one line
NVTX_DEPTH = 2  # NVTX levels drawn below the step range (deeper ones are autograd noise)
# A drawn interval from values this module typed itself (ms floats, names, a kind of SegKind):
# tens of thousands a report at many ranks, where validating each one costs more than the rest
# of the timeline's Python.
_seg = Seg.model_construct


def step_times(report: Report, ex: Extras) -> dict[int, dict[int, float]]:
    """rank -> step -> ms: iteration times when the capture has GPU work, else NVTX step ranges."""
    if report.gpu_activity and report.steps:
        out: dict[int, dict[int, float]] = defaultdict(dict)
        for s in report.steps:
            for rk, t in s.ms_by_rank.items():
                out[int(rk)][s.step] = t
        return dict(out)
    return ex.cpu_step_ms


def extras_from_views(v: Views, report: Report) -> Extras:
    ex = Extras()
    steps = v.query('SELECT rank, tid, step, start, "end" FROM steps ORDER BY rank, step')
    for r in steps:
        ex.cpu_step_ms.setdefault(r["rank"], {})[r["step"]] = ms(r["end"] - r["start"])
    for rk, by in ex.cpu_step_ms.items():
        ex.first_step[rk] = min(by)
    for r in v.query("""SELECT w.rank, o.step, sum(w.e - w.s) AS ns FROM nccl_waits w
                        JOIN comm_ops o ON o.rank = w.rank AND o.start = w.s
                        WHERE o.step IS NOT NULL GROUP BY ALL ORDER BY ALL"""):
        ex.wait_ms.setdefault(r["rank"], {})[r["step"]] = ms(r["ns"])
    picks = pick_steps(report, ex)
    if not picks:
        ex.note = "no steps found: no timeline"
        return ex
    main_tid = {r["rank"]: r["tid"] for r in steps}
    frames = [f for f in (_frame(v, report, ex, label, step, steps) for label, step in picks) if f]
    ops = _drawn_ops(v, frames)
    ex.views.extend(_step_view(v, report, f, ops.get(i, []), main_tid) for i, f in enumerate(frames))
    return ex


@dataclass(frozen=True)
class _Frame:
    """One step drawn: its label, the ranks drawn (with why) and the span [t0, t1]."""

    label: str
    step: int
    shown: dict[int, str]
    t0: int
    t1: int


def _frame(v: Views, report: Report, ex: Extras, label: str, step: int,
           steps: list[dict[str, Any]]) -> _Frame | None:
    shown = _shown_ranks(report, step, step_times(report, ex))
    if not shown:
        return None
    spans = [(r["start"], r["end"]) for r in steps if r["step"] == step and r["rank"] in shown]
    spans += [(r["s"], r["e"]) for r in v.query(
        "SELECT s, e FROM step_gpu WHERE step = ? AND list_contains(?, rank) AND s IS NOT NULL", [step, list(shown)])]
    if not spans:
        return None
    return _Frame(label, step, shown, min(s for s, _ in spans), max(e for _, e in spans))


def _drawn_ops(v: Views, frames: list[_Frame]) -> dict[int, list[dict[str, Any]]]:
    """The GPU ops of the drawn ranks inside each frame (by its index), from the event tables in
    one read for every frame: the analysis keeps the GPU ops of the ranks no map did only."""
    if not frames:
        return {}
    out: dict[int, list[dict[str, Any]]] = {}
    drawn = [(i, rk, f.t0, f.t1) for i, f in enumerate(frames) for rk in f.shown]
    rankpass.table_macro(v.con, "gpu_work_of")  # (made here: the analysis reads no mapped rank's events)
    for o in v.query("""SELECT f.i, o.rank, o.kind, o.is_comm, o.name, o.start, o."end"
                        FROM gpu_work_of(?) o
                        JOIN (SELECT unnest(?) AS i, unnest(?) AS rank, unnest(?) AS t0, unnest(?) AS t1) f
                          ON f.rank = o.rank AND o."end" > f.t0 AND o.start < f.t1
                        ORDER BY f.i, o.rank, o.start, o."end", o.kind, o.name""",
                     [sorted({rk for f in frames for rk in f.shown}), *(list(c) for c in zip(*drawn, strict=True))]):
        out.setdefault(o["i"], []).append(o)
    return out


def pick_steps(report: Report, ex: Extras) -> list[tuple[str, int]]:
    """The representative step (median of the per-step slowest rank) and the slowest step."""
    times = step_times(report, ex)
    per_step: dict[int, float] = defaultdict(float)
    for rk, by in times.items():
        first = ex.first_step.get(rk, min(by) if by else 0)
        for st, step_ms in by.items():
            if st != first:
                per_step[st] = max(per_step[st], step_ms)
    if not per_step:
        return []
    order = sorted(per_step, key=lambda s: (per_step[s], s))
    median, slowest = order[(len(order) - 1) // 2], order[-1]
    out = [(f"representative step {median} (median step time {per_step[median]:.1f} ms)", median)]
    if slowest != median:
        out.append((f"slowest step {slowest} ({per_step[slowest]:.1f} ms)", slowest))
    return out


def _shown_ranks(report: Report, step: int, times: dict[int, dict[int, float]]) -> dict[int, str]:
    """Ranks on the critical path first (roots, then their victims), the step's slowest and
    fastest, then an even sample, up to MAX_LANES: at hundreds of ranks the lanes that explain
    the step are drawn and the rest is one summary line."""
    have = sorted(rk for rk, by in times.items() if step in by) or sorted(r.rank for r in report.ranks)
    roots = {r.kind for r in registry() if r.root}
    first = [(rk, "root") for f in report.findings if f.kind in roots for rk in f.ranks if rk in have]
    first += [(rk, "victim") for f in report.findings for rk in f.victims[: MAX_LANES // 2] if rk in have]
    by = sorted((times[rk][step], rk) for rk in have if step in times.get(rk, {}))
    first += [(by[-1][1], "slowest"), (by[0][1], "fastest")] if by else []
    first += [(rk, "finding") for f in report.findings if f.kind != "healthy" for rk in f.ranks[:4] if rk in have]
    return pick_ranks(have, first, MAX_LANES, fill="stride", whole=False)


def _step_view(v: Views, report: Report, f: _Frame, ops: list[dict[str, Any]],
               main_tid: dict[int, int]) -> StepView:
    step, shown, t0, t1 = f.step, f.shown, f.t0, f.t1
    ranks = list(shown)

    def at(ns: int) -> float:
        return ms(ns - t0, 4)

    def clip(s: int, e: int) -> tuple[float, float]:
        return at(max(s, t0)), at(min(e, t1))

    lanes = {rk: Lane(rank=rk, role=role) for rk, role in shown.items()}
    waits = v.query("SELECT rank, s, e, waited_for FROM nccl_waits WHERE list_contains(?, rank) AND e > ? AND s < ?",
                  [ranks, t0, t1])
    wait_at = {(w["rank"], w["s"]): w for w in waits}
    for o in ops:
        lane, name = lanes[o["rank"]], o["name"] or "?"
        if not o["is_comm"]:
            kind = "compute" if o["kind"] in ("kernel", "graph") else "other GPU"  # graph: a CUDA graph replay
            lane.gpu.append(_seg(s=at(max(o["start"], t0)), e=at(min(o["end"], t1)), kind=kind, name=name))
            continue
        w = wait_at.get((o["rank"], o["start"]))
        split = min(w["e"], o["end"]) if w else o["start"]
        if split > o["start"]:
            s, e = clip(o["start"], split)
            lane.gpu.append(_seg(s=s, e=e, kind="comm waiting", name=f"{name}: waiting for rank {w['waited_for']}"))
        if o["end"] > split:
            s, e = clip(split, o["end"])
            lane.gpu.append(_seg(s=s, e=e, kind="comm transfer", name=name))
    for h in v.query("""SELECT rank, start, "end", name FROM host_syncs
                        WHERE list_contains(?, rank) AND "end" > ? AND start < ? ORDER BY ALL""", [ranks, t0, t1]):
        s, e = clip(h["start"], h["end"])
        lanes[h["rank"]].syncs.append(_seg(s=s, e=e, kind="sync", name=h["name"] or "sync"))
    step_depth = {r["rank"]: r["d"] for r in v.query(
        """SELECT s.rank, min(n.depth) AS d FROM steps s JOIN nvtx n ON n.rank = s.rank AND n.tid = s.tid
              AND n.start = s.start AND n."end" = s."end" WHERE s.step = ? GROUP BY s.rank""", [step])}
    for rk in ranks:
        tid, d0 = main_tid.get(rk), step_depth.get(rk, 0) or 0
        if tid is None:
            continue
        for n in v.query("""SELECT start, "end", depth, text FROM nvtx WHERE rank = ? AND tid = ? AND domain_id = 0
                            AND "end" > ? AND start < ? AND depth BETWEEN ? AND ? ORDER BY start""",
                       [rk, tid, t0, t1, d0, d0 + NVTX_DEPTH]):
            s, e = clip(n["start"], n["end"])
            lanes[rk].cpu.append(_seg(s=s, e=e, kind="nvtx", name=n["text"] or "", depth=int(n["depth"] - d0)))
    # The step's critical path: each wait on it, and each wait for a rank while it held the path
    # (a DP peer held up off the path), is an arrow from the rank waited for to the waiter.
    edges = [Edge(victim=b["rank"], via=b["waited_for"], root=b["waited_for"], s=at(max(b["s"], t0)),
                  e=at(min(b["e"], t1)))
             for b in v.query("""SELECT DISTINCT rank, waited_for, s, e FROM (
                                    SELECT w.* FROM cp_path k JOIN wait_edges w ON w.id = k.id WHERE k.step = ?
                                    UNION ALL
                                    SELECT w.* FROM cp_segments g JOIN wait_edges w ON w.step = g.step
                                     AND w.waited_for = g.rank AND w.e > g.s AND w.e <= g.e WHERE g.step = ?)
                                WHERE e > ? AND s < ? ORDER BY e - s DESC, rank, s, waited_for LIMIT 200""",
                               [step, step, t0, t1])]
    path = [PathSeg(rank=g["rank"], s=at(max(g["s"], t0)), e=at(min(g["e"], t1)),
                    created=ms(g["created_ns"]))
            for g in v.query("SELECT rank, s, e, created_ns FROM cp_segments WHERE step = ? AND e > s ORDER BY s",
                           [step])]
    return StepView(label=f.label, step=step, t1=at(t1), t0_ns=int(t0), lanes=list(lanes.values()), edges=edges,
                    path=path, hidden=_hidden(v, report, ranks, t0, t1))


def _hidden(v: Views, report: Report, shown: list[int], t0: int, t1: int) -> Hidden | None:
    rest = [r.rank for r in report.ranks if r.rank not in shown]
    if not rest:
        return None
    busy = {r["rank"]: ms(r["ns"], 6) for r in v.query(
        """SELECT rank, sum(least(e, ?) - greatest(s, ?)) AS ns FROM compute_islands
              SEMI JOIN (SELECT unnest(?) AS rank) USING (rank) WHERE e > ? AND s < ? GROUP BY rank""",
        [t1, t0, rest, t0, t1])}
    wait = {r["rank"]: ms(r["ns"], 6) for r in v.query(
        """SELECT rank, sum(least(e, ?) - greatest(s, ?)) AS ns FROM nccl_waits SEMI JOIN (SELECT unnest(?) AS rank)
              USING (rank) WHERE e > ? AND s < ? GROUP BY rank""", [t1, t0, rest, t0, t1])}
    h = Hidden(n=len(rest))
    if busy:
        h.busy_ms_median = round(statistics.median(busy.get(rk, 0.0) for rk in rest), 3)
    if wait:
        top = max(rest, key=lambda rk: wait.get(rk, 0.0))
        h.waiting_ms_median = round(statistics.median(wait.get(rk, 0.0) for rk in rest), 3)
        h.waiting_ms_max, h.waiting_max_rank = round(wait.get(top, 0.0), 3), top
    return h
