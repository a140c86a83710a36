"""Truth of tests/fixtures/layouts (README there): real TP, TP x DP and DP x PP jobs through `orch
submit`, some with only one rank per stage profiled. Only one has a planted cause: the pairs'
pp4-slow-loader job with ranks 0 and 2 profiled, whose slow loader is on rank 1, not profiled. Its
healthy twin is the pairs' pp4-even, run minutes earlier on the same four GPUs (the exports' GPU
UUIDs say so), which is what fixing the loader saves measured against."""

from __future__ import annotations

import sqlite3
import statistics
import tempfile
from pathlib import Path

from tests.truth import Truth, opened, peaks, range_starts, step_count

STEPS = "step %"  # tp_fsdp.py's and vit_pp_dp.py's `step N` ranges

TP_NOISE = ("no cause is planted (the test's words: neither TP run has one); which rank's GPU work starts late "
            "in a step (rank 0 here, rank 1 in the other run) changes from run to run, the README's 'rank that "
            "holds the other up' is that noise, not a cause; the loop thread's pthread_cond_wait while backward "
            "runs on the autograd threads says it waited, not why")

# case -> (about, cause, root, twin run (fixtures-relative) whose same ranks are subtracted, or None)
CASES = {
    "tp2": ("Llama-style transformer (6 layers of 4096) with DTensor TP=2 and FSDP2 over dp=1 on 2 H200, 8 steps, "
            "rank 0 prints the loss every 4 steps; " + TP_NOISE, "none", [], None),
    "tp2-rerun": ("tp2's job in a later call on another 2x H200 machine, --log-every 0 (no loss.item()); "
                  + TP_NOISE, "none", [], None),
    "tp2dp2": ("tp_fsdp.py TP2 x DP2 (TP all-reduces in 0-1/2-3, FSDP in 0,2/1,3) on 4 H200, 8 steps, every rank "
               "profiled, GPU metrics on rank 0; nothing planted", "none", [], None),
    "tp2dp2-one-per-stage": ("tp2dp2's job with profile.ranks one-per-stage (rank 0 alone profiled), same machine; "
                             "nothing planted", "none", [], None),
    "dp2pp2-slow-loader-one-per-stage": (
        "ViT-B/16 1F1B DP2xPP2 on 4 H200 (the pairs' pp4-slow-loader job): rank 1, a first-stage rank, has a "
        "1-worker DataLoader (--slow-loader-rank 1); only ranks 0 and 2 profiled, so the root's rank has no "
        "report", "input", [1], "pairs/pp4-even"),
}

HOW = {
    "root": "planted: the workload's arguments (spec.yaml, README): --slow-loader-rank 1 in the DP2xPP2 job, no "
            "fault argument in the TP jobs",
    "steps": "plain sqlite3: the workload's `step N` NVTX ranges on each profiled rank (the same count on every rank)",
    "peak_bytes": "plain sqlite3: CUDA_GPU_MEMORY_USAGE_EVENTS, allocations minus frees on the rank's device "
                  "(profiled ranks only)",
    "saving_ms": "plain sqlite3: the span from `step 1`'s start to the last step's start, mean over the profiled "
                 "ranks {ranks}, minus the same ranks' span in {twin} (healthy, 6+6 split, 8 workers a rank, "
                 "same GPU UUIDs, 5 min earlier). The twin profiled every rank without GPU metrics, this run "
                 "ranks 0 and 2 with 1 kHz metrics: the difference in tracing is not subtracted",
}


def _uuids(con: sqlite3.Connection) -> set[str]:
    return {u for (u,) in con.execute("SELECT uuid FROM TARGET_INFO_GPU")}


def _span(cons: dict[int, sqlite3.Connection], ranks: list[int]) -> float:
    """ms from `step 1`'s start to the last step's start, the mean over `ranks`."""
    spans = []
    for r in ranks:
        s = range_starts(cons[r], STEPS)
        spans.append((s[-1] - s[1]) / 1e6)
    return statistics.mean(spans)


def cases() -> list[Truth]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        def run(rel: str):
            d = Path(tmp) / rel.replace("/", "-")
            d.mkdir(exist_ok=True)
            return opened({"run": rel}, d)

        for name, (about, cause, root, twin) in CASES.items():
            spec = {"run": f"layouts/{name}"}
            with run(spec["run"]) as cons:
                t = Truth(case=f"layouts-{name}", about=about, input=spec, cause=cause, root=root,
                          steps=step_count(cons, STEPS), peak_bytes=peaks(cons),
                          how={k: HOW[k] for k in ("root", "steps", "peak_bytes")})
                if root and not set(root) <= set(cons):
                    t.how["root"] += f"; rank(s) {sorted(set(root) - set(cons))} not profiled: no export"
                if twin:
                    ranks = sorted(cons)
                    with run(twin) as twins:
                        if {frozenset(_uuids(c)) for c in [*cons.values(), *twins.values()]} != {
                                frozenset(_uuids(cons[ranks[0]]))}:
                            raise ValueError(f"{name}: twin {twin} ran on other GPUs")
                        t.saving_ms = round(_span(cons, ranks) - _span(twins, ranks), 1)
                    t.how["saving_ms"] = HOW["saving_ms"].format(ranks=ranks, twin=twin)
            out.append(t)
    return out
