"""Build `CaptureOverhead` (model_overhead.py) from the `capture_overhead` view
(metrics/sql/67_capture_overhead.sql): units, the `calls_capped` flag and the report's header
line."""

from __future__ import annotations

from typing import Any

from orchestrator.analyze.model_overhead import CaptureOverhead, RankOverhead
from orchestrator.analyze.units import ms


def overhead_line(ranks: list[RankOverhead], call_ns: int) -> str:
    """One sentence for the report's header, naming the worst distorted rank and what its
    estimate is made of (nsys' own recorded time, the per-call cost, or both)."""
    bad = [r for r in ranks if r.distorted]
    if not bad:
        return ""
    w = max(bad, key=lambda r: r.share_pct)
    others = f" ({len(bad) - 1} other rank(s) too)" if len(bad) > 1 else ""
    calls_ms = round(w.est_ms - w.profiler_ms, 3)
    calls = (f"{w.api_calls:,} traced CUDA calls at ~{call_ns / 1000:g} µs each, "
             + (f"capped at the {calls_ms:g} ms of launch gaps" if w.calls_capped else f"{calls_ms:g} ms"))
    parts = ([f"{w.profiler_ms:g} ms of nsys' own PROFILER_OVERHEAD"] if w.profiler_ms else []) + (
        [calls] if calls_ms > 0 else [])
    effect = "step times are inflated, launch gaps partly nsys' own" if calls_ms > 0 else "step times are inflated"
    return (f"capture overhead ≈ {w.share_pct:.0f} % of the window on rank {w.rank}{others} (estimated: "
            f"{' + '.join(parts)}): {effect}")


def build_overhead(v: Any) -> CaptureOverhead | None:
    """From the analysis views (engine.Views); None when no rank had a window."""
    rows = v.rows("capture_overhead")
    if not rows:
        return None
    call_ns = int(v.scalar("SELECT overhead_call_ns()"))
    ranks = [RankOverhead(rank=r["rank"], window_ms=ms(r["window_ns"]),
                          profiler_ms=ms(r["profiler_ns"]), api_calls=r["api_calls"],
                          launches=r["launches"], est_ms=ms(r["est_ns"]),
                          share_pct=round(100 * r["share"], 2), distorted=bool(r["distorted"]),
                          calls_capped=r["api_calls"] * call_ns > r["launch_gap_ns"])
             for r in sorted(rows, key=lambda r: r["rank"])]
    return CaptureOverhead(call_ns=call_ns, ranks=ranks, line=overhead_line(ranks, call_ns))
