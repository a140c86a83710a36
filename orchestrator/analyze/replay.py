"""Shape the replay views (61_replay.sql) into `Replay`: units only (ns -> ms); no analysis here."""

from __future__ import annotations

from orchestrator.analyze.model_replay import Replay, ReplayStep, WhatIf
from orchestrator.analyze.units import ms
from orchestrator.metrics.engine import Views


def build_replay(v: Views) -> Replay | None:
    """The replay and its what-ifs, or None when no step could be replayed."""
    err = v.rows("replay_error")
    if not err:
        return None
    e = err[0]
    steps = [ReplayStep(step=s["step"], measured_ms=ms(s["measured_ns"]), replayed_ms=ms(s["replayed_ns"]),
                        error_pct=float(s["error_pct"] or 0.0))
             for s in v.query("SELECT * FROM replay_steps ORDER BY step")]
    whatifs = [WhatIf(what=w["what"], rank=w["rank"], steps=w["steps"], saving_ms=ms(w["saving_ns"]),
                      saving_pct=float(w["saving_pct"] or 0.0), replayed=w["replayed"])
               for w in v.query("SELECT * FROM replay_whatif ORDER BY saving_ns DESC, scn")]
    return Replay(steps=steps, error_ms=ms(e["error_ns"]), error_pct=float(e["error_pct"] or 0.0),
                  worst_step_pct=float(e["worst_step_pct"] or 0.0), forced=int(e["forced"] or 0), whatifs=whatifs)
