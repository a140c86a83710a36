"""`orch submit` / `orch status` / `orch cancel`: run directories, manifests and job state."""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from orchestrator import __version__, naming
from orchestrator.errors import OrchError
from orchestrator.render import render
from orchestrator.rundir import ExpectedReport, Manifest, default_root, read_manifest
from orchestrator.runpaths import RunPaths
from orchestrator.spec import ResolvedJob
from orchestrator.submit.backend import TERMINAL, Backend, tail
from orchestrator.submit.local import LocalBackend
from orchestrator.submit.node import stop_file
from orchestrator.submit.slurm import SlurmBackend


def backend_for(executor: str) -> Backend:
    """The backend for a cluster config's / manifest's `executor`: the one place that knows
    the implementations, so the abstraction (backend.py) never imports them."""
    if executor == "slurm":
        return SlurmBackend()
    if executor == "local":
        return LocalBackend()
    raise OrchError(f"unknown executor {executor!r}; use 'slurm' or 'local' in the cluster config")


def new_run_dir(job: ResolvedJob, root: Path) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    for i in range(1000):
        run = root / (f"{job.spec.name}-{stamp}" + (f"-{i}" if i else ""))
        try:
            run.mkdir(parents=True)
            return run.resolve()
        except FileExistsError:
            continue
    raise RuntimeError("could not create a unique run directory")


def expected_reports(job: ResolvedJob, report_dir: Path, job_id: str) -> list[ExpectedReport]:
    return [ExpectedReport(rank=r, node=r // job.nproc_per_node,
                           glob=str(report_dir / naming.expected_glob(job.output_name, job_id, r)))
            for r in job.profiled_ranks]


def submit(job: ResolvedJob, root: Path | None = None) -> tuple[Path, Manifest]:
    """Render into a new run directory and submit; on failure nothing is left behind."""
    backend_for(job.cluster.executor).preflight(job)
    root = Path(root or job.spec.run_root or default_root())
    run = new_run_dir(job, root)
    paths = RunPaths(run)
    try:
        rendered = render(job, paths.scripts, report_dir=None if job.spec.profile.output_dir
                          else paths.reports, log_dir=paths.logs)
        rendered.write()
        paths.logs.mkdir(exist_ok=True)
        job_id = backend_for(job.cluster.executor).submit(job, rendered, paths.submitit)
        manifest = Manifest(
            orch_version=__version__, name=job.spec.name, job_id=job_id,
            executor=job.cluster.executor, cluster=job.cluster.name,
            submitted_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            spec_path=str(job.spec_path) if job.spec_path else None,
            spec=job.spec.model_dump(mode="json"),
            cluster_config=job.cluster.model_dump(mode="json"),
            nodes=job.nodes, nproc_per_node=job.nproc_per_node, world_size=job.world_size,
            gpus_per_node=job.gpus_per_node, layout=job.layout,
            profiled_ranks=job.profiled_ranks, collector_ranks=job.collector_ranks,
            gpu_metrics_set=job.gpu_metrics_set,
            output_name=job.output_name, report_dir=str(rendered.report_dir),
            report_pattern=rendered.report_pattern,
            expected_reports=expected_reports(job, rendered.report_dir, job_id),
            scripts={name: str(rendered.script_dir / name) for name in rendered.scripts},
            node_command=rendered.node_command, submitit_folder=str(paths.submitit),
            nsys=job.cluster.nsys.path,
        )
        manifest.write(run)
    except BaseException:
        shutil.rmtree(run, ignore_errors=True)
        raise
    return run, manifest


def existing_reports(manifest: Manifest) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for e in manifest.expected_reports:
        pattern = Path(e.glob)
        found[e.rank] = sorted(str(p) for p in pattern.parent.glob(pattern.name))
    return found


def submitit_folder(run: Path, m: Manifest) -> Path:
    """submitit's folder of the job: where the manifest says, else the run's own (a run
    directory moved or copied whole keeps its results, logs and stop record there)."""
    recorded = Path(m.submitit_folder)
    return recorded if recorded.is_dir() else RunPaths(run).submitit


def job_status(run: Path) -> dict[str, Any]:
    """State, per-task results (with log tails of failed tasks) and reports so far."""
    m = read_manifest(run)
    folder = submitit_folder(run, m)
    backend = backend_for(m.executor)
    tasks = backend.task_results(folder, m.job_id, backend.ntasks(m.nodes))
    state = backend.state(folder, m.job_id, tasks)
    if state["state"] in TERMINAL:
        for t in tasks:
            if t["result"] == "pending":  # the job is over and this task never reported back
                t["result"] = "lost"
                t["error"] = "no result: its node died or the job was killed before it finished"
    for t in tasks:
        if t["result"] not in ("success", "pending"):
            # The failing rank's own traceback when the task's output has one (what the user's
            # code raised), else the log's last lines (which end with the launcher's report).
            own = t.pop("traceback", None)
            t["log_kind"] = "traceback" if own else "tail"
            t["log_tail"] = own or tail(Path(t["stderr"])) or tail(Path(t["stdout"]))
    if state["state"] in ("FAILED", "TIMEOUT", "NODE_FAIL", "CANCELLED"):
        for t in tasks:
            if "log_tail" not in t:
                t["log_tail"] = tail(Path(t["stderr"]))
    if state.get("stop"):
        # orch stopped the job: on each node it stopped, its own lines (the stop order, reports
        # lost or recovered) say more than torchrun's traceback of the SIGTERM it was sent. A
        # node that failed by itself (whose failure stopped the others) keeps its own tail.
        for t in tasks:
            if not stop_file(folder, m.job_id, t["task"]).exists():
                continue
            said = [ln for ln in tail(Path(t["stderr"]), 400).splitlines() if ln.startswith("orch: ")]
            if said:
                t["log_tail"], t["log_kind"] = "\n".join(dict.fromkeys(said)), "orch"
    return {"run": str(run), "job_id": m.job_id, "name": m.name, "executor": m.executor,
            **state, "tasks": tasks, "profiled_ranks": m.profiled_ranks,
            "reports": existing_reports(m)}


def cancel(run: Path) -> tuple[Manifest, list[str]]:
    """Stop the job, its captures first; returns the manifest (for its job id) and the pids
    that had to be killed because they outlived the stop."""
    m = read_manifest(run)
    killed = backend_for(m.executor).cancel(Path(m.submitit_folder), m.job_id)
    return m, killed


def wait(run: Path, on_poll: Callable[[dict[str, Any]], None] | None = None,
         poll_s: float = 2.0, timeout_s: float | None = None) -> dict[str, Any]:
    t0 = time.monotonic()
    while True:
        st = job_status(run)
        if st["state"] in TERMINAL:
            st = _settled(run, st, poll_s)
        if on_poll:
            on_poll(st)
        if st["state"] in TERMINAL:
            return st
        if timeout_s is not None and time.monotonic() - t0 > timeout_s:
            return st
        time.sleep(poll_s)


def _settled(run: Path, st: dict[str, Any], poll_s: float, settle_s: float = 15) -> dict[str, Any]:
    """The status once the reports stopped arriving: a node's last nsys may still be renaming
    its report onto a shared file system when the scheduler already says the job ended."""
    want = len(st["profiled_ranks"])
    found = sum(1 for v in st["reports"].values() if v)
    deadline = time.monotonic() + settle_s
    while found < want and time.monotonic() < deadline:
        time.sleep(poll_s)
        again = job_status(run)
        now = sum(1 for v in again["reports"].values() if v)
        st = again
        if now == found:
            break
        found = now
    return st
