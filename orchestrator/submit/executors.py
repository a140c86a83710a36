"""submitit executors for both backends, and job state that never sticks at UNKNOWN.

Each task (one per node) runs the rendered per-node launch through `CommandFunction`, the
same command `sbatch.sh` gives to srun: one source of truth for the command line.
Slurm state comes from sacct when accounting exists, else squeue, else `scontrol show job`;
local state from the controller pid and submitit's result pickles.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import CommandFunction, FailedJobError

from orchestrator.errors import OrchError
from orchestrator.render import Rendered
from orchestrator.spec import ResolvedJob

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def slurm_minutes(time: str | None) -> int:
    """Slurm time string -> whole minutes (rounded up), the unit submitit expects."""
    if not time:
        return 60
    days, _, rest = time.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:  # D-HH[:MM[:SS]]
        parts += [0] * (3 - len(parts))
        h, m, s = parts
    elif len(parts) == 3:
        h, m, s = parts
    elif len(parts) == 2:
        h, m, s = 0, parts[0], parts[1]
    else:
        h, m, s = 0, parts[0], 0
    total_s = ((int(days or 0) * 24 + h) * 60 + m) * 60 + s
    return max(1, -(-total_s // 60))


def _extra_params(lines: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for line in lines:
        key, sep, value = line.lstrip("-").partition("=")
        out[key.replace("-", "_")] = value if sep else True
    return out


def make_executor(job: ResolvedJob, folder: Path) -> submitit.Executor:
    s = job.slurm
    if job.cluster.executor == "local":
        ex = submitit.LocalExecutor(folder=folder)
        # LocalExecutor exports CUDA_VISIBLE_DEVICES from gpus_per_node (0 hides all GPUs).
        ex.update_parameters(timeout_min=slurm_minutes(s.time), nodes=1, tasks_per_node=1,
                             gpus_per_node=job.gpus_per_node)
        return ex
    ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
    params: dict[str, Any] = {
        "job_name": job.spec.name, "nodes": job.nodes, "ntasks_per_node": 1,
        "time": slurm_minutes(s.time), "signal_delay_s": 30,
        # As in sbatch.sh: one failing node ends the job instead of leaving the others
        # blocked in a collective until NCCL/gloo time out.
        "srun_args": ["--kill-on-bad-exit=1"],
    }
    for key in ("partition", "account", "qos", "constraint", "mem", "cpus_per_task", "exclusive"):
        value = getattr(s, key)
        if value:
            params[key] = value
    if job.gpus_per_node:
        params["gpus_per_node"] = job.gpus_per_node
    setup = list(s.setup or []) + [f"module load {m}" for m in (s.modules or [])]
    if setup:
        params["setup"] = setup
    if s.extra_sbatch:
        params["additional_parameters"] = _extra_params(s.extra_sbatch)
    ex.update_parameters(**params)
    return ex


def submit_job(job: ResolvedJob, rendered: Rendered, folder: Path) -> submitit.Job:
    ex = make_executor(job, folder)
    fn = CommandFunction(rendered.node_command, verbose=True, cwd=str(rendered.script_dir.parent))
    try:
        # submitit echoes sbatch's stderr itself; it is folded into our one-line error instead.
        with contextlib.redirect_stderr(io.StringIO()):
            return ex.submit(fn)
    except FailedJobError as e:
        lines = [ln.strip().removeprefix("sbatch: error:").strip() for ln in str(e).splitlines() if ln.strip()]
        raise OrchError(f"sbatch rejected the job: {'; '.join(lines) or 'no message'}") from None
    except (subprocess.CalledProcessError, OSError) as e:
        raise OrchError(f"could not submit the job ({e}); check that sbatch works on this host") from None


# ---------------------------------------------------------------- state


def _run(cmd: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _norm(state: str) -> str:
    s = state.split()[0].rstrip("+") if state.strip() else "UNKNOWN"
    return "CANCELLED" if s.startswith("CANCELLED") else s


def slurm_state(job_id: str) -> dict[str, Any]:
    """{'state', 'source', 'steps': [...], 'exit_code'}, trying sacct, squeue, scontrol."""
    p = _run(["sacct", "-j", job_id, "-n", "-P", "-o", "JobID,State,ExitCode,NodeList"])
    if p is not None and p.returncode == 0 and p.stdout.strip():
        rows = [ln.split("|") for ln in p.stdout.strip().splitlines()]
        main = next((r for r in rows if r[0] == job_id), rows[0])
        steps = [{"id": r[0], "state": _norm(r[1]), "exit_code": r[2], "nodes": r[3]} for r in rows[1:]]
        return {"state": _norm(main[1]), "exit_code": main[2], "nodes": main[3], "steps": steps, "source": "sacct"}
    q = _run(["squeue", "-h", "-j", job_id, "-o", "%T|%N"])
    if q is not None and q.returncode == 0 and q.stdout.strip():
        state, _, nodes = q.stdout.strip().splitlines()[0].partition("|")
        if _norm(state) not in TERMINAL:
            return {"state": _norm(state), "nodes": nodes, "steps": [], "source": "squeue"}
    c = _run(["scontrol", "show", "job", job_id])
    if c is not None and c.returncode == 0:
        m = re.search(r"JobState=(\S+)", c.stdout)
        ec = re.search(r"ExitCode=(\S+)", c.stdout)
        nodes = re.search(r"\bNodeList=(\S+)", c.stdout)
        if m:
            return {"state": _norm(m.group(1)), "exit_code": ec.group(1) if ec else None,
                    "nodes": nodes.group(1) if nodes else None, "steps": [], "source": "scontrol"}
    return {"state": "UNKNOWN", "steps": [], "source": "none (job no longer known to Slurm)"}


def task_results(folder: Path, job_id: str, ntasks: int) -> list[dict[str, Any]]:
    """Per-task outcome from submitit's files: result pickle ('success'/'error') and logs."""
    out = []
    for t in range(ntasks):
        base = folder / f"{job_id}_{t}"
        res = Path(f"{base}_result.pkl")
        info: dict[str, Any] = {"task": t, "stdout": f"{base}_log.out", "stderr": f"{base}_log.err"}
        if res.exists():
            try:
                with open(res, "rb") as fh:
                    outcome, value = pickle.load(fh)
                info["result"] = outcome
                if outcome == "error":
                    info["error"] = str(value).strip().splitlines()[-1][:300] if str(value).strip() else ""
            except Exception as e:
                info["result"] = f"unreadable ({e.__class__.__name__})"
        else:
            info["result"] = "pending"
        out.append(info)
    return out


def local_state(job_id: str, tasks: list[dict[str, Any]]) -> dict[str, Any]:
    try:
        os.kill(int(job_id), 0)
        alive = Path(f"/proc/{job_id}").exists() and "Z" not in _proc_state(job_id)
    except (ProcessLookupError, ValueError):
        alive = False
    except PermissionError:
        alive = True
    results = {t["result"] for t in tasks}
    if alive and "pending" in results:
        state = "RUNNING"
    elif results == {"success"}:
        state = "COMPLETED"
    elif "error" in results:
        state = "FAILED"
    else:
        state = "CANCELLED" if (Path(tasks[0]["stdout"]).parent / f".{job_id}.cancelled").exists() else "FAILED"
    return {"state": state, "steps": [], "source": "local controller"}


def _proc_state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1]
    except (OSError, IndexError):
        return "Z"


def cancel(executor: str, job_id: str, folder: Path) -> None:
    if executor == "local":
        (folder / f".{job_id}.cancelled").touch()
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(job_id), signal.SIGTERM)  # the controller forwards it to its tasks
        return
    p = _run(["scancel", job_id])
    if p is None or p.returncode != 0:
        raise OrchError(f"scancel {job_id} failed: {(p.stderr.strip() if p else 'scancel not found')}")
