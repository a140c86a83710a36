"""Shape the critical-path views (59_critical_path.sql) into `CriticalPath`: units only (ns ->
ms relative to each step's start) and the segments in time order; no analysis here."""

from __future__ import annotations

from collections import defaultdict

from orchestrator.analyze.engine import Views
from orchestrator.analyze.model_critical import CriticalPath, CriticalStep, PathSegment
from orchestrator.analyze.units import ms


def build_critical_path(v: Views) -> CriticalPath | None:
    """The per-step critical path, or None when no step has matched waits across ranks."""
    steps = v.query("SELECT step, rank, t0, t1 FROM cp_steps ORDER BY step")
    if not steps:
        return None
    segs: dict[int, list[PathSegment]] = defaultdict(list)
    t0 = {s["step"]: s["t0"] for s in steps}
    for g in v.query("SELECT step, rank, s, e, waited_for, created_ns FROM cp_segments WHERE e > s ORDER BY step, s"):
        segs[g["step"]].append(PathSegment(rank=g["rank"], s=ms(g["s"] - t0[g["step"]]),
                                           e=ms(g["e"] - t0[g["step"]]), after_wait_for=g["waited_for"],
                                           created_ms=ms(g["created_ns"])))
    roots = {r["step"]: r for r in v.query("SELECT * FROM cp_roots")}
    out, by_root = [], defaultdict(float)
    for s in steps:
        r = roots.get(s["step"])
        cs = CriticalStep(step=s["step"], ms=ms(s["t1"] - s["t0"]), end_rank=s["rank"], path=segs[s["step"]])
        if r:
            cs.root, cs.root_phase, cs.root_ms = r["rank"], r["phase"], ms(r["created_ns"])
            cs.root_share_pct, cs.victims = float(r["share_pct"]), list(r["victims"])
            by_root[r["rank"]] += cs.root_ms
        out.append(cs)
    comp = {c["what"]: ms(c["ns"]) for c in v.query(
        """WITH seg AS (SELECT sum(e - s) AS ns FROM cp_segments WHERE e > s),
                ph AS (SELECT what, sum(ns) AS ns FROM cp_segment_phase GROUP BY what)
           SELECT what, ns FROM ph UNION ALL
           SELECT 'other', greatest((SELECT ns FROM seg) - (SELECT sum(ns) FROM ph), 0)""")}
    return CriticalPath(steps=out, composition_ms=comp, roots={k: round(x, 3) for k, x in sorted(by_root.items())})
