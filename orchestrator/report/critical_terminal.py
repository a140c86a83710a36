"""The terminal's critical-path lines: what the steps' critical paths were made of, which ranks
held them up and how often, and the steps it held up most; then the replay's error and its
what-ifs. The HTML draws each path; the terminal says who, doing what, and how much, in a few
lines."""

from __future__ import annotations

from orchestrator.analyze.model_report import Report

MAX_STEPS = 3  # the steps held up most, by the root's excess


def critical_lines(report: Report) -> list[str]:
    """A few lines, or none without a critical path (no matched collectives or send/recv)."""
    cp = report.critical_path
    if cp is None or not cp.steps:
        return []
    parts = [f"{k} {v:.0f} %" for k, v in sorted(cp.composition_pct.items(), key=lambda kv: -kv[1]) if v >= 5]
    lines = [f"critical path over {len(cp.steps)} step(s): " + (", ".join(parts) if parts else "no work on it")]
    held = [s for s in cp.steps if s.root is not None]
    if not held:
        lines.append("  no rank held the steps up (no rank put >= 10 % of a step on its path)")
        return lines
    lines.append("  held up by " + "; ".join(
        f"rank {h.rank} in {h.steps}/{len(cp.steps)} step(s), {h.ms_per_held_step:.1f} ms each, "
        f"{h.saving_ms:.1f} ms saved at the others' pace" for h in cp.held_by[:4])
        + (f"; {len(cp.held_by) - 4} more rank(s)" if len(cp.held_by) > 4 else ""))
    for s in sorted(held, key=lambda s: (-s.root_ms, s.step))[:MAX_STEPS]:
        victims = ", ".join(map(str, s.victims[:6])) + (" …" if len(s.victims) > 6 else "")
        lines.append(f"  step {s.step}: {s.ms:.1f} ms; rank {s.root} put {s.root_ms:.1f} ms ({s.root_share_pct:.0f} %)"
                     f" on it in {s.root_phase or '?'}" + (f"; waited: rank(s) {victims}" if victims else ""))
    return lines


def replay_lines(report: Report) -> list[str]:
    """The replay's error and its what-ifs, the most saving first (none without a replay)."""
    rp = report.replay
    if rp is None:
        return []
    lines = [rp.line]
    shown = rp.shown()[:3]
    if shown:
        lines.append("  what-ifs: " + "; ".join(f"{w.label} saves {w.saving_ms:.1f} ms "
                                                f"({w.saving_pct:.1f} %)" for w in shown))
    return lines
