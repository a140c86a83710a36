"""The terminal's GPU memory line: the rank with the highest peak against its GPU's capacity,
the cross-rank spread, the fastest growth per step, and allocator calls per step."""

from __future__ import annotations

from rich.console import Console

from orchestrator.analyze.model_report import Report
from orchestrator.report.prose import say

GIB = 2**30


def memory_line(report: Report) -> str | None:
    """One line, or None without memory events and with under one allocator call per step."""
    m = report.memory
    if m is None:
        return None
    parts = []
    peak = m.rank(m.peak_rank) if m.peak_rank is not None else None
    if peak is not None and peak.peak_bytes is not None:
        cap = (f" of {peak.capacity_bytes / GIB:.1f} GiB ({peak.peak_pct:.1f} %)"
               if peak.capacity_bytes and peak.peak_pct is not None else "")
        parts.append(f"peak {peak.peak_bytes / GIB:.2f} GiB{cap} on rank {peak.rank}")
        if len(m.ranks) > 1 and m.spread_bytes is not None:
            parts.append(f"spread {m.spread_bytes / GIB:.2f} GiB across {len(m.ranks)} ranks")
        grow = [r for r in m.ranks if r.growth_bytes_per_step is not None]
        if grow:
            g = max(grow, key=lambda r: (r.growth_bytes_per_step or 0, -r.rank))
            parts.append(f"growth {(g.growth_bytes_per_step or 0) / 2**20:+.1f} MiB/step (rank {g.rank})")
    churn = [r for r in m.ranks if r.alloc_calls_per_step is not None]
    if churn:
        c = max(churn, key=lambda r: ((r.alloc_calls_per_step or 0) + (r.free_calls_per_step or 0), -r.rank))
        parts.append(f"allocator {(c.alloc_calls_per_step or 0) + (c.free_calls_per_step or 0):.1f} "
                     f"calls/step, {c.alloc_api_pct or 0:.1f} % CPU (rank {c.rank})")
    if m.source == "none":
        if not churn or max((r.alloc_calls_per_step or 0) + (r.free_calls_per_step or 0) for r in churn) < 1:
            return None  # nothing worth a line: the JSON and HTML carry the hint
        parts.append("no memory events (profile.cuda_memory_usage: true records them)")
    return "GPU memory: " + "; ".join(parts)


def print_memory(report: Report, console: Console) -> None:
    line = memory_line(report)
    if line:
        say(console, line)
