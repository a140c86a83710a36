"""Shape the critical-path views (59_critical_path.sql) into `CriticalPath`: units only (ns ->
ms relative to each step's start) and the segments in time order; no analysis here."""

from __future__ import annotations

from collections import defaultdict

from orchestrator.analyze.model_critical import CriticalPath, CriticalRoot, CriticalStep, PathSegment
from orchestrator.analyze.units import ms
from orchestrator.metrics.engine import Views


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
    out = []
    for s in steps:
        r = roots.get(s["step"])
        cs = CriticalStep(step=s["step"], ms=ms(s["t1"] - s["t0"]), end_rank=s["rank"], path=segs[s["step"]])
        if r:
            cs.root, cs.root_phase, cs.root_ms = r["rank"], r["phase"], ms(r["created_ns"])
            cs.root_share_pct, cs.victims = float(r["share_pct"]), list(r["victims"])
            cs.root_saving_ms = ms(r["saving_ns"])
        out.append(cs)
    comp = v.query("SELECT what, ns, pct FROM cp_composition ORDER BY ns DESC, what")  # the JSON's key order
    by = v.query("SELECT * FROM cp_held_by ORDER BY total_ns DESC, rank")
    held = [CriticalRoot(rank=h["rank"], steps=h["steps"], total_ms=ms(h["total_ns"]),
                         ms_per_held_step=ms(h["per_held_ns"]),
                         ms_per_step=ms(h["per_step_ns"]), saving_ms=ms(h["saving_ns"])) for h in by]
    return CriticalPath(steps=out, composition_ms={c["what"]: ms(c["ns"]) for c in comp},
                        composition_pct={c["what"]: c["pct"] for c in comp},
                        held_by=held)
