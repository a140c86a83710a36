"""Assemble the cross-rank report (the documented JSON schema) from the SQL results.

Schema (all times in ms, percentages 0-100):
  window      {source, steps, gap_ms, note, per_rank{rank: [start_ms, end_ms]}}
  ranks[]     rank, host, stage, status, window_ms, compute_ms, comm_ms, overlap_ms,
              comm_overlap_pct, exposed_comm_ms, gpu_busy_ms, gpu_idle_pct, p2p_ms (NCCL
              send/recv share of comm_ms), nccl_wait_ms,
              late_count, collectives, gaps_by_range_ms{}, top_gaps[], step_ms[]
  steps[]     step, ms_by_rank{}, spread_ms, warmup
  stages[]    stage, ranks, compute_ms (mean), bubble_pct (mean of 100*(1-compute/window))
  imbalance   {ratio, slowest_stage, fastest_stage} or null without a layout
  stragglers[] rank, late_count, collectives, wait_caused_ms, share_of_window_pct, p_value
  findings[]  kind, severity, ranks, title, evidence, fix, cost_ms
  missing_ranks[], problems[]   ranks without data and why (status error/missing/duplicate),
              or with partial data (status partial: missing tables/columns)
  cpu_phases[] rank, range, ms_per_step, steps: CPU self time per step in each NVTX range
  gpu_activity  false for CPU-only captures (the GPU metrics are then all zero)
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from orchestrator import __version__
from orchestrator.analyze.engine import Options, query
from orchestrator.analyze.findings import find_all, ns_to_ms, straggler_stats

SCHEMA_VERSION = 1


def _pct(a: float, b: float) -> float:
    return round(100.0 * a / b, 2) if b else 0.0


def build_report(store: Path, opts: Options) -> dict[str, Any]:
    q = query(store, opts)
    gaps_by: dict[int, dict[str, float]] = defaultdict(dict)
    for g in q["gaps_by_range"]:
        gaps_by[g["rank"]][g["range_group"]] = ns_to_ms(g["ns"])
    top: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for g in q["top_gaps"]:
        top[g["rank"]].append({"start_ms": ns_to_ms(g["s"]), "ms": ns_to_ms(g["dur"]),
                               "range": g["range_group"], "text": g["range_text"]})
    step_ms: dict[int, list[dict[str, Any]]] = defaultdict(list)
    by_step: dict[int, dict[int, float]] = defaultdict(dict)
    warm: dict[int, bool] = {}
    for s in q["steps"]:
        step_ms[s["rank"]].append({"step": s["step"], "ms": ns_to_ms(s["ns"]), "warmup": bool(s["warmup"])})
        by_step[s["step"]][s["rank"]] = ns_to_ms(s["ns"])
        warm[s["step"]] = warm.get(s["step"], False) or bool(s["warmup"])

    ranks, problems, missing = [], [], []
    for r in q["ranks"]:
        if r["status"] == "missing":
            missing.append(r["rank"])
        if r["status"] != "ok":
            problems.append({"rank": r["rank"], "status": r["status"], "reason": r["error"]})
        if r["window_ns"] is None:
            continue
        win, comm, ov, busy = r["window_ns"], r["comm_ns"], r["overlap_ns"], r["busy_ns"]
        ranks.append({
            "rank": r["rank"], "host": r["host"], "stage": r["stage"], "status": r["status"],
            "window_ms": ns_to_ms(win), "compute_ms": ns_to_ms(r["compute_ns"]), "comm_ms": ns_to_ms(comm),
            "overlap_ms": ns_to_ms(ov), "comm_overlap_pct": _pct(ov, comm),
            "exposed_comm_ms": ns_to_ms(comm - ov), "gpu_busy_ms": ns_to_ms(busy),
            "gpu_idle_pct": round(100.0 - _pct(busy, win), 2) if win else 0.0,
            "p2p_ms": ns_to_ms(r["p2p_ns"]), "nccl_wait_ms": ns_to_ms(r["nccl_wait_ns"]),
            "late_count": int(r["late_count"] or 0),
            "collectives": int(r["n_coll"] or 0),
            "gaps_by_range_ms": gaps_by.get(r["rank"], {}),
            "top_gaps": top.get(r["rank"], []),
            "step_ms": step_ms.get(r["rank"], []),
            "_window": (r["w0"], r["w1"]), "_source": r["window_source"],
        })
    sources = sorted({x.pop("_source") for x in ranks})
    per_rank_window = {x["rank"]: [ns_to_ms(v) for v in x.pop("_window")] for x in ranks}

    steps = []
    for step in sorted(by_step):
        vals = by_step[step]
        steps.append({"step": step, "ms_by_rank": {str(k): v for k, v in sorted(vals.items())},
                      "spread_ms": round(max(vals.values()) - min(vals.values()), 3),
                      "warmup": warm[step]})

    layout = q["layout"]
    stages, imbalance = [], None
    if layout.get("known"):
        per_stage: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for x in ranks:
            if x["stage"] is not None:
                per_stage[x["stage"]].append(x)
        for st, xs in sorted(per_stage.items()):
            stages.append({
                "stage": st, "ranks": [x["rank"] for x in xs],
                "compute_ms": round(sum(x["compute_ms"] for x in xs) / len(xs), 3),
                "bubble_pct": round(sum(100 - _pct(x["compute_ms"], x["window_ms"]) for x in xs) / len(xs), 2),
                "gpu_idle_pct": round(sum(x["gpu_idle_pct"] for x in xs) / len(xs), 2),
            })
        if len(stages) > 1 and min(s["compute_ms"] for s in stages) > 0:
            hi = max(stages, key=lambda s: s["compute_ms"])
            lo = min(stages, key=lambda s: s["compute_ms"])
            imbalance = {"ratio": round(hi["compute_ms"] / lo["compute_ms"], 3),
                         "slowest_stage": hi["stage"], "fastest_stage": lo["stage"]}

    stragglers = straggler_stats(q, ranks)
    window_note = (
        "no `step N` NVTX ranges: the whole capture is the window" if not q["has_steps"]
        else ("steps " + (f"{opts.steps[0]}..{opts.steps[1]}" if opts.steps else "after each rank's first"))
    )
    report = {
        "schema_version": SCHEMA_VERSION, "orch_version": __version__, "store": str(store),
        "window": {"source": sources, "steps": list(opts.steps) if opts.steps else None,
                   "gap_ms": opts.gap_ms, "note": window_note, "per_rank": per_rank_window},
        "layout": layout, "ranks": ranks, "steps": steps, "stages": stages, "imbalance": imbalance,
        "stragglers": stragglers, "missing_ranks": missing, "problems": problems,
        "cpu_phases": [{"rank": c["rank"], "range": c["grp"], "ms_per_step": ns_to_ms(c["ns_per_step"]),
                        "steps": c["n_steps"]} for c in q["cpu_phases"]],
        "gpu_activity": any(r["gpu_busy_ms"] > 0 for r in ranks),
    }
    report["findings"] = find_all(q, report)
    return report
