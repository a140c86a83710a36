"""Findings: each rule turns measured numbers into (kind, severity, ranks, evidence, fix).

Rules follow the classic tables (data-loader stall, pageable copies, exposed communication,
stragglers, stage imbalance, launch-bound kernels). No finding without evidence; the cost
of each finding (ms of GPU time it explains) orders the list and sets its severity.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from typing import Any

DATA_RANGE = re.compile(r"data|load|batch|input|fetch|collate|sampler|prefetch", re.I)
FIX = {
    "data_loader_stall": (
        "Feed the GPU ahead of time: DataLoader(num_workers>0, pin_memory=True, prefetch_factor>=2, "
        "persistent_workers=True), copy with .to(device, non_blocking=True), and move decoding/"
        "augmentation out of the training loop."
    ),
    "pageable_memcpy": (
        "Copy from pinned memory: pin_memory=True in the DataLoader (or tensor.pin_memory()) and "
        ".to(device, non_blocking=True); pageable host-to-device copies are synchronous and slower."
    ),
    "exposed_communication": (
        "Overlap gradient all-reduce with backward: tune DDP bucket_cap_mb (smaller buckets start "
        "earlier), avoid sync points in backward, consider gradient accumulation with no_sync(), "
        "or FSDP/ZeRO prefetching; check NCCL uses the fast fabric (NCCL_DEBUG=INFO)."
    ),
    "stage_imbalance": (
        "Re-balance the pipeline: move layers from the slowest stage to the fastest (Megatron "
        "--decoder-first/last-pipeline-num-layers, PiPPy split points), or add microbatches to "
        "shrink the bubble."
    ),
    "launch_bound": (
        "The GPU waits on kernel launches: capture steady-state steps with CUDA graphs "
        "(torch.cuda.graphs / torch.compile(mode='reduce-overhead')), fuse small ops "
        "(torch.compile), or grow the per-kernel work (batch size)."
    ),
    "cpu_gap": (
        "The GPU idles while the CPU runs this range: move the work off the critical path "
        "(overlap it with GPU work, do it asynchronously or less often) or make it faster."
    ),
}


def ns_to_ms(ns: float | int | None) -> float:
    """ns -> ms, rounded to the µs the report shows."""
    return round((ns or 0) / 1e6, 3)


def _severity(pct_of_window: float) -> str:
    return "high" if pct_of_window >= 20 else "medium" if pct_of_window >= 5 else (
        "low" if pct_of_window >= 1 else "info")


def binom_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): how likely this many 'last' starts are by chance."""
    if k <= 0:
        return 1.0
    return min(1.0, sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1)))


def straggler_stats(q: dict[str, Any], ranks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    win = {r["rank"]: r["window_ms"] for r in ranks}
    out = []
    for r in q["ranks"]:
        n, late, g = int(r["n_coll"] or 0), int(r["late_count"] or 0), int(r["group_size"] or 0)
        if not n or not late or g < 2:
            continue
        p_value = binom_tail(late, n, 1.0 / g)
        if p_value >= 0.01 or late / n <= 1.5 / g:
            continue
        caused = ns_to_ms(r["wait_caused_ns"])
        others = [w for k, w in win.items() if k != r["rank"]]
        mean_win = sum(others) / len(others) if others else 0
        out.append({
            "rank": r["rank"], "late_count": late, "collectives": n, "group_size": g,
            "wait_caused_ms": caused, "median_lateness_ms": ns_to_ms(r["median_lateness_ns"]),
            "share_of_window_pct": round(100 * caused / ((g - 1) * mean_win), 2) if mean_win else 0.0,
            "p_value": float(f"{p_value:.3g}"),
        })
    return sorted(out, key=lambda s: -s["wait_caused_ms"])


def _straggler_findings(q: dict[str, Any], report: dict[str, Any]) -> list[dict[str, Any]]:
    ctx: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for c in q["straggler_context"]:
        ctx[c["rank"]].append(c)
    busy = {b["rank"]: b for b in q["late_busy"]}
    out = []
    for s in report["stragglers"]:
        rk = s["rank"]
        waiting = [r for r in report["ranks"] if r["rank"] != rk and r["nccl_wait_ms"] > 0]
        evidence = [
            f"rank {rk} started last in {s['late_count']} of {s['collectives']} collectives "
            f"(chance: 1 in {s['group_size']}; p={s['p_value']:.2g}), median {s['median_lateness_ms']} ms late",
            f"the other ranks waited {s['wait_caused_ms']} ms for it in NCCL kernels "
            f"({s['share_of_window_pct']}% of their window)",
        ]
        for w in waiting:
            evidence.append(f"rank {w['rank']}: {w['nccl_wait_ms']} ms of its {w['comm_ms']} ms of "
                            f"communication ({round(100 * w['nccl_wait_ms'] / w['comm_ms']) if w['comm_ms'] else 0}%)"
                            " was waiting")
        b = busy.get(rk)
        wait_ms = ns_to_ms(b["wait_ns"]) if b else 0.0
        top = ctx.get(rk, [])
        cause = None
        if top and wait_ms and ns_to_ms(top[0]["ns"]) >= 0.3 * wait_ms:
            cause = top[0]["range_group"]
            evidence.append(f"while they waited, rank {rk}'s GPU sat idle for {ns_to_ms(top[0]['ns'])} ms "
                            f"({round(100 * ns_to_ms(top[0]['ns']) / wait_ms)}% of the wait) with its CPU in "
                            f"`{cause}`")
        elif b and wait_ms:
            busy_pct = round(100 * ns_to_ms(b["busy_ns"]) / wait_ms)
            evidence.append(f"while they waited, rank {rk}'s GPU was busy {busy_pct}% "
                            "of the time (still running earlier work); no CPU-side range explains the lateness")
        if cause and DATA_RANGE.search(cause):
            fix = f"Rank {rk} is late because its `{cause}` is slow: " + FIX["data_loader_stall"]
        elif cause:
            fix = f"Rank {rk} is late while in `{cause}`: make that range faster on rank {rk} or move it off the step."
        else:
            fix = (f"No CPU-side cause is visible. Compare rank {rk}'s kernel times and GPU clocks with "
                   "the others (nvidia-smi -q -d CLOCK,PERFORMANCE: throttling, ECC, PCIe/NVLink), its "
                   "input sizes (uneven shards or sequence lengths), and its host (CPU contention, NUMA).")
        out.append({
            "kind": "straggler", "ranks": [rk], "severity": _severity(s["share_of_window_pct"]),
            "title": f"rank {rk} is a straggler" + (f" (in `{cause}`)" if cause else ""),
            "evidence": evidence, "fix": fix, "cost_ms": s["wait_caused_ms"],
        })
    return out


def _cpu_phase_findings(q: dict[str, Any]) -> list[dict[str, Any]]:
    """For captures without GPU activity (CPU runs, CUDA tracing off): a rank whose CPU spends
    far longer per step in a range (self time) than the others. In synchronous training the
    others then wait the same time out inside their collectives, so the LARGEST excess is
    reported as the cause and other ranks' excesses as probable waiting. GPU captures use
    the gap attribution instead, which sees what the GPU lost."""
    cpu_only = {r["rank"] for r in q["ranks"] if r["window_source"] == "steps (cpu only)"}
    per: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for row in q["cpu_phases"]:
        if row["rank"] in cpu_only:
            per[row["grp"]][row["rank"]] = row
    hot = []  # (offset, grp, rank, row, median of the others)
    for grp, rows in per.items():
        for rk, r in rows.items():
            others = [o["ns_per_step"] for k, o in rows.items() if k != rk]
            if not others:
                continue
            med = statistics.median(others)
            excess = r["ns_per_step"] - med
            if r["ns_per_step"] >= 3 * med and excess >= 1e6 and excess >= 0.1 * (r["step_ns"] or 0):
                hot.append((excess, grp, rk, r, med))
    if not hot:
        return []
    hot.sort(key=lambda h: -h[0])
    grp = hot[0][1]
    causes = [h for h in hot if h[1] == grp]
    waits = [h for h in hot if h[1] != grp and h[2] not in {c[2] for c in causes}]
    evidence = [f"rank {c[2]}: {ns_to_ms(c[3]['ns_per_step'])} ms per step in `{grp}` (self time) vs a median of "
                f"{ns_to_ms(c[4])} ms on the other ranks ({round(100 * c[3]['ns_per_step'] / c[3]['step_ns'])}% of its "
                f"{ns_to_ms(c[3]['step_ns'])} ms CPU step, {c[3]['n_steps']} steps)" for c in causes]
    evidence += [f"rank {w[2]}: `{w[1]}` takes {ns_to_ms(w[3]['ns_per_step'] - w[4])} ms longer per step than on the "
                 f"others: most likely waiting for rank(s) "
                 f"{', '.join(str(c[2]) for c in causes)} in a collective" for w in waits]
    worst = max(100 * (c[3]["ns_per_step"] - c[4]) / c[3]["step_ns"] for c in causes)
    ranks = sorted({c[2] for c in causes})
    return [{
        "kind": "cpu_phase_outlier", "ranks": ranks, "severity": _severity(worst),
        "title": f"`{grp}` is slow on rank(s) {', '.join(map(str, ranks))}",
        "evidence": evidence,
        "fix": (f"Rank(s) {', '.join(map(str, ranks))}: " + (FIX["data_loader_stall"] if DATA_RANGE.search(grp)
                                                             else FIX["cpu_gap"])),
        "cost_ms": round(max(ns_to_ms(c[3]["ns_per_step"] - c[4]) * c[3]["n_steps"] for c in causes), 3),
    }]


def find_all(q: dict[str, Any], report: dict[str, Any]) -> list[dict[str, Any]]:
    ranks = report["ranks"]
    win = {r["rank"]: r["window_ms"] for r in ranks}
    found = _straggler_findings(q, report)

    # GPU idle inside data-loading ranges, and other CPU ranges that leave the GPU idle.
    data, other = defaultdict(float), defaultdict(lambda: defaultdict(float))
    for r in ranks:
        for name, ms in r["gaps_by_range_ms"].items():
            if DATA_RANGE.search(name):
                data[r["rank"]] += ms
            else:
                other[name][r["rank"]] += ms
    stall = {rk: ms for rk, ms in data.items() if win.get(rk) and ms >= 0.05 * win[rk]}
    if stall:
        worst = max(100 * ms / win[rk] for rk, ms in stall.items())
        found.append({
            "kind": "data_loader_stall", "ranks": sorted(stall), "severity": _severity(worst),
            "title": "GPU idle while waiting for input data",
            "evidence": [f"rank {rk}: GPU idle {round(ms, 3)} ms inside data-loading ranges "
                         f"({round(100 * ms / win[rk], 1)}% of its window)" for rk, ms in sorted(stall.items())],
            "fix": FIX["data_loader_stall"], "cost_ms": round(max(stall.values()), 3),
        })
    for name, per in other.items():
        hit = {rk: ms for rk, ms in per.items() if win.get(rk) and ms >= 0.1 * win[rk]}
        if hit:
            worst = max(100 * ms / win[rk] for rk, ms in hit.items())
            found.append({
                "kind": "cpu_gap", "ranks": sorted(hit), "severity": _severity(worst),
                "title": f"GPU idle while the CPU is in `{name}`",
                "evidence": [f"rank {rk}: {round(ms, 3)} ms of GPU gaps >= {report['window']['gap_ms']} ms "
                             f"in `{name}` ({round(100 * ms / win[rk], 1)}% of its window)"
                             for rk, ms in sorted(hit.items())],
                "fix": FIX["cpu_gap"], "cost_ms": round(max(hit.values()), 3),
            })

    # Large pageable host-to-device copies.
    pageable = defaultdict(lambda: [0, 0.0])
    for m in q["memcpy"]:
        if m["kind"] == "HtoD" and m["src_kind"] == "pageable":
            pageable[m["rank"]][0] += int(m["bytes"] or 0)
            pageable[m["rank"]][1] += ns_to_ms(m["ns"])
    big = {rk: v for rk, v in pageable.items() if v[0] >= (1 << 20) and win.get(rk) and v[1] >= 0.01 * win[rk]}
    if big:
        found.append({
            "kind": "pageable_memcpy", "ranks": sorted(big),
            "severity": _severity(max(100 * v[1] / win[rk] for rk, v in big.items())),
            "title": "large host-to-device copies from pageable memory",
            "evidence": [f"rank {rk}: {v[0] / 2**20:.1f} MiB pageable HtoD in {round(v[1], 3)} ms"
                         for rk, v in sorted(big.items())],
            "fix": FIX["pageable_memcpy"], "cost_ms": round(max(v[1] for v in big.values()), 3),
        })

    # Collective communication not hidden behind compute, beyond waiting for late ranks
    # (stragglers) and pipeline send/recv (the bubble, see stage imbalance).
    exposed = {}
    for r in ranks:
        transfer = r["exposed_comm_ms"] - r["nccl_wait_ms"] - r["p2p_ms"]
        if r["comm_ms"] and r["comm_overlap_pct"] < 50 and transfer >= 0.1 * r["window_ms"]:
            exposed[r["rank"]] = (r, transfer)
    if exposed:
        found.append({
            "kind": "exposed_communication", "ranks": sorted(exposed),
            "severity": _severity(max(100 * t / r["window_ms"] for r, t in exposed.values())),
            "title": "communication is not overlapped with compute",
            "evidence": [f"rank {rk}: {r['comm_overlap_pct']}% of {r['comm_ms']} ms NCCL time overlaps compute; "
                         f"{round(t, 3)} ms exposed beyond waiting for other ranks and pipeline send/recv"
                         for rk, (r, t) in sorted(exposed.items())],
            "fix": FIX["exposed_communication"], "cost_ms": round(max(t for _, t in exposed.values()), 3),
        })

    imb = report["imbalance"]
    if imb and imb["ratio"] >= 1.25:
        stages = {s["stage"]: s for s in report["stages"]}
        hi, lo = stages[imb["slowest_stage"]], stages[imb["fastest_stage"]]
        move = round(100 * (hi["compute_ms"] - lo["compute_ms"]) / (2 * hi["compute_ms"]))
        found.append({
            "kind": "stage_imbalance", "ranks": hi["ranks"],
            "severity": "high" if imb["ratio"] >= 1.5 else "medium",
            "title": f"pipeline stage {hi['stage']} is {imb['ratio']}x heavier than stage {lo['stage']}",
            "evidence": [f"stage {s['stage']} (ranks {s['ranks']}): compute {s['compute_ms']} ms, "
                         f"no-compute share (bubble) {s['bubble_pct']}%" for s in report["stages"]],
            "fix": FIX["stage_imbalance"] + f" Moving about {move}% of stage {hi['stage']}'s compute "
                   f"to stage {lo['stage']} evens them.",
            "cost_ms": round(hi["compute_ms"] - lo["compute_ms"], 3),
        })

    # Many tiny kernels separated by launch gaps.
    small = {s["rank"]: s for s in q["small_gaps"]}
    launch = []
    for k in q["kernel_stats"]:
        rk, sg = k["rank"], small.get(k["rank"])
        per_step = k["n"] / max(1, k["n_steps"])
        if sg and win.get(rk) and k["median_ns"] < 20_000 and per_step >= 200 and ns_to_ms(sg["ns"]) >= 0.1 * win[rk]:
            launch.append((rk, k, sg))
    if launch:
        found.append({
            "kind": "launch_bound", "ranks": [x[0] for x in launch],
            "severity": _severity(max(100 * ns_to_ms(sg["ns"]) / win[rk] for rk, _, sg in launch)),
            "title": "many tiny kernels with launch gaps between them",
            "evidence": [f"rank {rk}: {k['n']} kernels (median {k['median_ns'] / 1e3:.1f} us), "
                         f"{sg['n']} sub-threshold gaps totalling {ns_to_ms(sg['ns'])} ms" for rk, k, sg in launch],
            "fix": FIX["launch_bound"], "cost_ms": max(ns_to_ms(sg["ns"]) for _, _, sg in launch),
        })

    found += _cpu_phase_findings(q)
    if not report["layout"].get("known") and any(r["p2p_ms"] > 0 for r in ranks):
        found.append({
            "kind": "layout_needed", "ranks": [r["rank"] for r in ranks if r["p2p_ms"] > 0], "severity": "info",
            "title": "pipeline send/recv seen but no layout given",
            "evidence": [f"rank {r['rank']}: {r['p2p_ms']} ms in NCCL send/recv kernels" for r in ranks if r["p2p_ms"]],
            "fix": "Pass --layout tp=..,pp=..,dp=.. (or set layout in the job spec) to compare pipeline stages.",
            "cost_ms": 0.0,
        })
    order = {"high": 0, "medium": 1, "low": 2, "info": 3}
    found.sort(key=lambda f: (order[f["severity"]], -f["cost_ms"]))
    if not any(f["severity"] in ("high", "medium") for f in found):
        busy = [100 - r["gpu_idle_pct"] for r in ranks if r["gpu_busy_ms"] > 0]
        found.append({
            "kind": "healthy", "ranks": [r["rank"] for r in ranks], "severity": "info",
            "title": "no significant bottleneck found",
            "evidence": [f"GPU busy {min(busy):.1f}-{max(busy):.1f}% of the window across ranks" if busy
                         else "no GPU activity was captured (CPU-only run or CUDA tracing off): GPU metrics "
                              "are empty; only the CPU phases were compared"],
            "fix": "Nothing to fix from this profile.", "cost_ms": 0.0,
        })
    return found
