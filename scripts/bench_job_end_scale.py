"""Job end -> report at 64-1,024 ranks, from one real job's reports multiplied: what a user waits
for after the job when the ranks exported their own reports in the job (`orch collect` only
reduces the exports) against `orch collect` exporting every report itself.

    python scripts/bench_job_end_scale.py [--ranks 64,256,1024] [--job-ranks 8] [--steps 300]
        [--modes in_job,collect,on_cluster] [--chunk 16]

One real job (scripts/examples/train.py, gloo, real nsys, `profile.export_in_job: true`) through
`orch submit --wait` on the local executor gives `--job-ranks` reports and their exports. For
each N, rank k of N is rank k % job-ranks of that job under rank k's own file name (host
`h<k // 8>`, as 8 ranks a node): the reports are hard links, the exports copies (nsys 2022.4's
CPU exports carry no rank of their own: orch takes it from the name). Then, each timed as a whole
command: `orch collect --from <exports>` + `orch report` (in_job), and `orch collect --from
<reports>` + `orch report` (collect: nsys export of every report, `--workers` at a time, here on
this machine's cores; on a cluster the in-job exports run on every node at once, during the job).
With `--modes on_cluster`: `orch collect --from <reports> --on-cluster --cluster local-slurm
--chunk C` (a Slurm job array of map tasks, C reports each, then the reduce here); it needs the
local two-node Slurm (scripts/local_slurm.sh start, SLURM_CONF set); `on_cluster_central` is the same
with `--no-map-stats` (the report computes every rank's API and thread tables itself).
`map_in_job` (profile.map_in_job): every rank's export is first mapped as the job's ranks map it
(jobmap.map_in_job, one after the other in this process: on a cluster each rank maps its own on
its node during the job, so this is not after-job time; its mean per rank is printed, and one
`python -m orchestrator.collect.jobmap` as the job starts it), then `orch collect --parts`, which
finds every part fresh and only reduces, + `orch report`.
Not a test: the numbers depend on the machine. Prints one JSON line per (N, mode).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_job_end import orch, submit_job

NAME = re.compile(r"^(?P<prefix>.+_r)(?P<rank>\d+)_(?P<host>[^.]+)\.(?P<pid>\d+)$")


def multiply(run: Path, n: int, dest: Path) -> tuple[Path, Path]:
    """`dest/reports` (hard links) and `dest/exports` (copies) for n ranks from the run's own."""
    src = {}
    for rep in sorted(run.rglob("*.nsys-rep")):
        m = NAME.match(rep.name[: -len(".nsys-rep")])
        exp = next(run.rglob(f"exports/{rep.name[: -len('.nsys-rep')]}.sqlite"), None)
        if m and exp:
            src[int(m["rank"])] = (m, rep, exp)
    if not src:
        raise SystemExit(f"no report with an in-job export under {run}")
    reps, exps = dest / "reports", dest / "exports"
    reps.mkdir(parents=True)
    exps.mkdir()
    world = sorted(src)
    for k in range(n):
        m, rep, exp = src[world[k % len(world)]]
        stem = f"{m['prefix']}{k}_h{k // 8}.{100_000 + k}"
        os.link(rep, reps / f"{stem}.nsys-rep")
        shutil.copyfile(exp, exps / f"{stem}.sqlite")
    return reps, exps


def after_job(inputs: Path, work: Path, workers: int, cluster: list[str]) -> dict[str, float]:
    """`cluster`: empty, or `orch collect` options that map as a Slurm job array."""
    store = work / "store"
    collect_s = orch("collect", "--from", str(inputs), "--out", str(store), "--workers", str(workers), *cluster)
    report_s = orch("report", str(store), "--json", str(work / "r.json"))
    ranks = len(json.loads((work / "r.json").read_text())["ranks"])
    shutil.rmtree(store)
    return {"collect_s": round(collect_s, 1), "report_s": round(report_s, 1),
            "after_job_s": round(collect_s + report_s, 1), "ranks_in_report": ranks}


def map_like_the_job(reps: Path, exps: Path, store: Path) -> dict[str, float]:
    """What profile.map_in_job leaves when the job ends: every rank's parts and statistics under
    store/parts, from its export in store/exports."""
    from orchestrator.collect.jobmap import map_in_job

    shutil.copytree(exps, store / "exports", copy_function=os.link)
    reports = sorted(reps.glob("*.nsys-rep"))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-s", "-m", "orchestrator.collect.jobmap", str(store), str(reports[0])],
                          capture_output=True, text=True)
    one_s = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(proc.stderr)
    t0 = time.perf_counter()
    for rep in reports[1:]:
        ok, said = map_in_job(store, rep)
        if not ok:
            raise SystemExit(said)
    return {"job_map_process_s": round(one_s, 2),
            "job_map_s_per_rank": round((time.perf_counter() - t0) / max(1, len(reports) - 1), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="64,256,1024")
    ap.add_argument("--job-ranks", type=int, default=8)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--modes", default="in_job,collect",
                    help="of in_job, map_in_job, collect, on_cluster, on_cluster_central (--no-map-stats)")
    ap.add_argument("--chunk", type=int, default=16, help="on_cluster: reports per array task")
    a = ap.parse_args()
    on_cluster = ["--on-cluster", "--cluster", "local-slurm", "--chunk", str(a.chunk)]
    with tempfile.TemporaryDirectory(prefix="orch-jobend-scale-") as d:
        work = Path(d)
        _, run = submit_job(work, a.job_ranks, a.steps, "local", in_job=True)
        for n in (int(x) for x in a.ranks.split(",")):
            reps, exps = multiply(run, n, work / f"n{n}")
            for mode in a.modes.split(","):
                cluster = {"on_cluster": on_cluster, "on_cluster_central": [*on_cluster, "--no-map-stats"],
                           "map_in_job": ["--parts"]}
                job = map_like_the_job(reps, exps, work / f"n{n}" / "store") if mode == "map_in_job" else {}
                out = after_job(exps if mode == "in_job" else reps, work / f"n{n}", a.workers, cluster.get(mode, []))
                print(json.dumps({"ranks": n, "mode": mode, "job_ranks": a.job_ranks, "steps": a.steps,
                                  "workers": a.workers, **job, **out}), flush=True)
            shutil.rmtree(work / f"n{n}")


if __name__ == "__main__":
    main()
