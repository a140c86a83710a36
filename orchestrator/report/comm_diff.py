"""Bandwidth rows of `orch diff`: median bus bandwidth per collective kind, message-size bucket
and scope, A vs B. A drop beyond `DROP` (relative, times the threshold scale) is a regression,
named as `busbw <kind> <bucket> (<scope>)`: the run whose link got slower says which traffic."""

from __future__ import annotations

from typing import Any

from orchestrator.analyze.model_report import Report

DROP = 0.20  # a 20 % lower median busbw regresses
MIN_BUCKET = 1 << 20  # smaller messages are latency-bound: their bandwidth is noise
MIN_INSTANCES = 2


def comm_rows(a: Report, b: Report, scale: float = 1.0) -> list[dict[str, Any]]:
    """One row per (kind, size bucket, scope) present in both reports with bandwidth."""
    if a.comm is None or b.comm is None:
        return []
    ka = {(k.kind, k.bucket_bytes, k.scope): k for k in a.comm.by_kind}
    out = []
    for k in b.comm.by_kind:
        o = ka.get((k.kind, k.bucket_bytes, k.scope))
        if (o is None or k.bucket_bytes < MIN_BUCKET or not o.median_busbw_gbps or k.median_busbw_gbps is None
                or min(o.instances, k.instances) < MIN_INSTANCES):
            continue
        va, vb = o.median_busbw_gbps, k.median_busbw_gbps
        out.append({"rank": "all", "metric": f"busbw {k.kind} {k.size_bucket} ({k.scope}) GB/s",
                    "a": round(va, 3), "b": round(vb, 3), "delta": round(vb - va, 3),
                    "regressed": (va - vb) / va > DROP * scale})
    return out
