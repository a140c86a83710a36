"""The GPU's busy share of a workload run WITHOUT a profiler, as the driver counts it: NVML's
`utilization.gpu` (the share of each sample period in which a kernel ran), read by `nvidia-smi`
every 100 ms while the command runs. A truth for "does the GPU idle in this loop" that no trace
distorts: nsys' own per-call cost inflates the gaps it records.

    python nvml_busy.py OUT.json -- python3 hf_trainer.py --accum 4 --steps 60

Writes every sample and the mean and median of the middle half of the longest stretch of samples
with a kernel (the loop: start-up, data generation, warm-up and tail left out; CUDA's set-up shows
as a lone sample long before it); NVML's period is coarse, so it is only a check of shares of
several %.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time


def steady(samples: list[int]) -> list[int]:
    """The middle half of the longest run of nonzero samples."""
    best: list[int] = []
    cur: list[int] = []
    for x in [*samples, 0]:
        if x > 0:
            cur.append(x)
        else:
            best, cur = (cur if len(cur) > len(best) else best), []
    return best[len(best) // 4: 3 * len(best) // 4] or best


def main(argv: list[str]) -> int:
    out, sep, cmd = argv[0], argv[1], argv[2:]
    if sep != "--" or not cmd:
        raise SystemExit(__doc__)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                            "-lms", "100"], stdout=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    rc = subprocess.run(cmd, check=False).returncode
    wall = time.monotonic() - t0
    smi.terminate()
    samples = [int(x) for x in smi.communicate()[0].split() if x.strip().isdigit()]
    mid = steady(samples)
    res = {"cmd": cmd, "rc": rc, "wall_s": round(wall, 2), "n": len(samples),
           "mid_mean_pct": round(statistics.mean(mid), 1) if mid else None,
           "mid_median_pct": statistics.median(mid) if mid else None, "samples": samples}
    with open(out, "w") as f:
        json.dump(res, f)
    print(json.dumps({k: v for k, v in res.items() if k != "samples"}))
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
