"""Job end -> report, with the exports made in the job (profile.export_in_job) against without:
real jobs through `orch submit --wait` (scripts/examples/train.py, gloo, real nsys), then
`orch collect` and `orch report --json`, timed as whole commands.

    python scripts/bench_job_end.py [--ranks 2,4,8] [--steps 200] [--cluster local|local-slurm] [--runs N]

Modes: in_job, collect, and on the local Slurm also on_cluster (`orch collect --on-cluster`).
Per rank count and mode it prints one JSON line: the job's wall time (submit to COMPLETED, the
in-job exports included), collect, report, and after_job_s = collect + report: what a user
waits for once the job ended. Not a test: the numbers depend on the machine; on one machine
the ranks' exports share its cores, where on a cluster each node exports its own.
For the local Slurm (`--cluster local-slurm`) SLURM_CONF must name its slurm.conf
(scripts/local_slurm.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent


def orch(*args: str) -> float:
    """Run one orch command to its end; its wall time in s. A failed command ends the benchmark."""
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True,
                       env=os.environ.copy())
    if p.returncode != 0:
        raise SystemExit(f"orch {args[0]} failed: {p.stdout[-800:]}{p.stderr[-800:]}")
    return time.monotonic() - t0


def submit_job(work: Path, ranks: int, steps: int, cluster: str, in_job: bool) -> tuple[float, Path]:
    """One real job of scripts/examples/train.py through `orch submit --wait` (2 nodes on the local
    Slurm); its wall time and run directory."""
    nodes = 2 if cluster == "local-slurm" else 1
    spec = {"name": "jobend", "cluster": cluster, "run_root": str(work / "runs"),
            "slurm": {"time": "20:00", **({"nodes": nodes} if nodes > 1 else {})},
            "launch": {"script": str(REPO / "scripts" / "examples" / "train.py"), "nproc_per_node": ranks // nodes,
                       "args": ["--steps", str(steps)], "env": {"GLOO_SOCKET_IFNAME": "lo"}},
            "layout": {"tp": 1, "pp": 1},
            "profile": {"ranks": "all", "trace": ["nvtx", "osrt"], "export_in_job": in_job,
                        "map_in_job": False}}  # the exports alone (bench_job_end_scale.py: with the maps)
    (work / "job.yaml").write_text(yaml.safe_dump(spec))
    job_s = orch("submit", str(work / "job.yaml"), "--wait", "--timeout", "1200")
    (run,) = (work / "runs").iterdir()
    return job_s, run


def one(work: Path, ranks: int, steps: int, cluster: str, mode: str) -> dict[str, object]:
    """mode: in_job (the ranks export), collect (collect exports), on_cluster (`orch collect
    --on-cluster`: a Slurm job array exports and maps, the reduce runs here)."""
    job_s, run = submit_job(work, ranks, steps, cluster, mode == "in_job")
    collect_s = orch("collect", str(run), *(["--on-cluster"] if mode == "on_cluster" else []))
    report_s = orch("report", str(run), "--json", str(work / "r.json"))
    exported = len(list((run / "exports").glob("*.sqlite")))
    return {"ranks": ranks, "cluster": cluster, "mode": mode, "steps": steps,
            "job_s": round(job_s, 1), "collect_s": round(collect_s, 1), "report_s": round(report_s, 1),
            "after_job_s": round(collect_s + report_s, 1), "exports": exported}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4,8")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--cluster", default="local", choices=["local", "local-slurm"])
    ap.add_argument("--runs", type=int, default=1, help="repeats of each (rank count, mode)")
    a = ap.parse_args()
    for n in (int(x) for x in a.ranks.split(",")):
        for _ in range(a.runs):
            for mode in ("in_job", "collect", *(["on_cluster"] if a.cluster == "local-slurm" else [])):
                with tempfile.TemporaryDirectory(prefix="orch-jobend-") as d:
                    print(json.dumps(one(Path(d), n, a.steps, a.cluster, mode)), flush=True)


if __name__ == "__main__":
    main()
