"""GPU memory rows of `orch diff`: per rank, peak bytes in use and growth per step, A vs B.

A peak that rises by more than `PEAK_RISE` (relative, times the threshold scale) and by at least
`MIN_PEAK_BYTES` regresses: the same job now needs more memory, closer to out-of-memory. Growth
per step regresses when it rises by more than `GROWTH_RISE` bytes per step (times the scale):
a leak that was not there. Values are GiB and MiB/step, as the report prints them."""

from __future__ import annotations

from typing import Any

from orchestrator.analyze.model_report import Report

PEAK_RISE = 0.10
MIN_PEAK_BYTES = 256 << 20  # smaller changes are the allocator's rounding and cache, not the job
GROWTH_RISE = 4 << 20


def memory_rows(a: Report, b: Report, scale: float = 1.0) -> list[dict[str, Any]]:
    """One peak row and one growth row per rank with memory events in both reports."""
    if a.memory is None or b.memory is None:
        return []
    ma = {r.rank: r for r in a.memory.ranks if r.peak_bytes is not None}
    out = []
    for rb in sorted((r for r in b.memory.ranks if r.peak_bytes is not None), key=lambda r: r.rank):
        ra = ma.get(rb.rank)
        if ra is None or ra.peak_bytes is None or rb.peak_bytes is None:
            continue
        pa, pb = ra.peak_bytes, rb.peak_bytes
        out.append({"rank": rb.rank, "metric": "peak_gpu_memory_gib", "a": round(pa / 2**30, 3),
                    "b": round(pb / 2**30, 3), "delta": round((pb - pa) / 2**30, 3),
                    "regressed": pb - pa >= MIN_PEAK_BYTES and pa > 0 and (pb - pa) / pa > PEAK_RISE * scale})
        if ra.growth_bytes_per_step is not None and rb.growth_bytes_per_step is not None:
            ga, gb = ra.growth_bytes_per_step, rb.growth_bytes_per_step
            out.append({"rank": rb.rank, "metric": "gpu_memory_growth_mib_per_step", "a": round(ga / 2**20, 3),
                        "b": round(gb / 2**20, 3), "delta": round((gb - ga) / 2**20, 3),
                        "regressed": gb - ga > GROWTH_RISE * scale})
    return out
