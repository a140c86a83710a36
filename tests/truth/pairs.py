"""Truth of tests/fixtures/pairs (README there): real jobs with and without a planted cause. The
cause and its rank are the workload's arguments; what fixing it saves is what the run took longer
than its healthy twin from the same machine and call, measured over the same steps."""

from __future__ import annotations

import itertools
import statistics
import tempfile
from pathlib import Path

from tests.truth import Truth, opened, peaks, range_starts, span_ms, step_count

RESNET = "Step % Start"  # ddp_faults.py's steps (the tutorial's NVTX ranges)
VIT = "step %"           # vit_pp_dp.py's steps


def _periods(cons, like: str) -> dict[int, float]:
    """Per step N, ms from the start of range N to range N+1, the median over the ranks."""
    per: dict[int, list[float]] = {}
    for con in cons.values():
        for n, (a, b) in enumerate(itertools.pairwise(range_starts(con, like))):
            per.setdefault(n, []).append((b - a) / 1e6)
    return {n: statistics.median(v) for n, v in per.items()}


def _median_gap(slow, healthy, like: str) -> float:
    """The difference of the two runs' median step periods times the steps after the first (the
    last one's period has no next start to end it, but it is analysed all the same): the
    runs' warm-up differs (the healthy run's steps 2-10 at 63-71 ms, its later ones at 50 ms), so
    sums would count warm-up as the cause."""
    s, h = _periods(slow, like), _periods(healthy, like)
    steps = [n for n in s if n >= 1 and n in h]
    return (statistics.median(s[n] for n in steps) - statistics.median(h[n] for n in steps)) * (len(steps) + 1)


# case -> (about, cause, root, like, twin, how the saving is measured: "median" or "span")
CASES = {
    "healthy": ("ResNet-50 DDP on 4 H200, healthy", "none", [], RESNET, None, None),
    "gpu-straggler": ("ResNet-50 DDP on 4 H200, one rank runs 8 extra 3072x3072 GEMMs a step",
                      "gpu-compute", [1], RESNET, "healthy", "median"),
    "cpu-straggler": ("ResNet-50 DDP on 4 H200, one rank's loop thread sleeps 15 ms before each forward",
                      "cpu", [0], RESNET, "healthy", "median"),
    "ddp-accum": ("ResNet-50 DDP on 2 H100, 4 micro-batches of accumulation a step, launch-bound",
                  "launch", [0, 1], RESNET, None, None),
    "ddp-accum-rerun": ("ddp-accum again on the same machine", "launch", [0, 1], RESNET, None, None),
    "ddp2-healthy": ("ResNet-50 DDP on 2 H200, healthy", "none", [], RESNET, None, None),
    "ddp2-slow-loader": ("ResNet-50 DDP on 2 H200, one rank's DataLoader has 2 workers, the other's 8",
                         "input", [1], RESNET, "ddp2-healthy", "span"),
    "ddp2-input-bound": ("ResNet-50 DDP on 2 H200, every rank's DataLoader has 2 workers",
                         "input", [0, 1], RESNET, "ddp2-healthy", "span"),
    "ddp4-healthy": ("ResNet-50 DDP on 4 H200, healthy", "none", [], RESNET, None, None),
    "ddp4-healthy-rerun": ("ddp4-healthy again, two jobs later", "none", [], RESNET, None, None),
    "ddp4-slow-loader": ("ResNet-50 DDP on 4 H200, one rank's DataLoader has 2 workers, the others' 8",
                         "input", [1], RESNET, "ddp4-healthy", "span"),
    "pp-even": ("ViT-B/16 1F1B pp=2 on 2 H100, blocks split 6+6 (the fastest split)", "none", [], VIT, None, None),
    "pp-uneven": ("ViT-B/16 1F1B pp=2 on 2 H100, blocks split 4+8", "stage", [1], VIT, "pp-even", "median"),
    "pp-even-h200": ("ViT-B/16 1F1B pp=2 on 2 H200, split 6+6", "none", [], VIT, None, None),
    "pp-slow-input": ("ViT-B/16 1F1B pp=2 on 2 H200, the first stage's DataLoader has 1 worker",
                      "input", [0], VIT, "pp-even-h200", "median"),
    "pp4-even": ("ViT-B/16 1F1B DP2xPP2 (FSDP2 in each stage) on 4 H200, split 6+6", "none", [], VIT, None, None),
    "pp4-even-rerun": ("pp4-even again on another machine", "none", [], VIT, None, None),
    "pp4-uneven": ("ViT-B/16 1F1B DP2xPP2 on 4 H200, split 4+8", "stage", [2, 3], VIT, "pp4-even", "span"),
    "pp4-slow-loader": ("ViT-B/16 1F1B DP2xPP2 on 4 H200, one first-stage rank's DataLoader has 1 worker",
                        "input", [1], VIT, "pp4-even", "span"),
}

ACCUM = {"ddp-accum": 4, "ddp-accum-rerun": 4}  # micro-batches (one step range each) per optimizer step

HOW = {
    "root": "planted: the workload's --fault-rank / --slow-loader-rank / --stage-blocks (README)",
    "steps": "plain sqlite3: the workload's step NVTX ranges on each rank (the same count on every rank)",
    "peak_bytes": "plain sqlite3: CUDA_GPU_MEMORY_USAGE_EVENTS, allocations minus frees on the rank's device",
    "median": "plain sqlite3: (median step period - its twin's) x the steps after the first, twin from the same call",
    "span": "plain sqlite3: the span from step 1's start to the last step's start minus its twin's, mean over "
            "the ranks, per period x the steps after the first (a starved loader's steps take two lengths in "
            "turn: no typical step)",
}


def cases() -> list[Truth]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        def run(name: str):
            d = Path(tmp) / name
            d.mkdir(exist_ok=True)
            return opened({"run": f"pairs/{name}"}, d)

        for name, (about, cause, root, like, twin, measure) in CASES.items():
            with run(name) as cons:
                accum = ACCUM.get(name, 1)
                t = Truth(case=f"pairs-{name}", about=about, input={"run": f"pairs/{name}"}, cause=cause,
                          root=root, steps=step_count(cons, like) // accum, peak_bytes=peaks(cons),
                          how={k: HOW[k] for k in ("root", "steps", "peak_bytes")})
                if accum > 1:
                    t.how["steps"] += f": one optimizer step every {accum} ranges (--accum {accum})"
                if twin:
                    with run(twin) as twins:
                        n = step_count(cons, like) - 1  # the steps after the first, as analysed
                        t.saving_ms = round(_median_gap(cons, twins, like) if measure == "median"
                                            else (span_ms(cons, like) - span_ms(twins, like)) * n / (n - 1), 1)
                    t.how["saving_ms"] = HOW[measure] + f" ({twin})"
            out.append(t)
    return out
