"""The Slurm backend: submitit's `SlurmExecutor`, and job state that never sticks at UNKNOWN.

State comes from submitit's own sacct watcher; orch adds only what submitit lacks: without
accounting (sacct fails or has not seen the job) it asks squeue, then `scontrol show job`,
then judges by submitit's result files. orch's node supervisor ends the job at the early
warning sent before the time limit (after the captures stopped), so Slurm records FAILED; the
supervisor's stop file says TIMEOUT.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import submitit
from submitit.slurm.slurm import SlurmInfoWatcher

from orchestrator.errors import OrchError
from orchestrator.limits import KILL_WAIT_S, slurm_minutes
from orchestrator.spec import ResolvedJob
from orchestrator.submit.backend import TERMINAL, SubmititBackend, job_stop_timing, tail
from orchestrator.submit.node import SETTLE_S, cancel_file, stop_file, supervisor_file

__all__ = ["SlurmBackend", "normalize_state", "run_command", "scheduler_state", "slurm_minutes"]


def _extra_params(lines: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for line in lines:
        key, sep, value = line.lstrip("-").partition("=")
        out[key.replace("-", "_")] = value if sep else True
    return out


class _Watcher(SlurmInfoWatcher):
    """submitit's sacct watcher, asking for the exit code too (its parser reads columns by name)."""

    def _make_command(self) -> list[str] | None:
        cmd = super()._make_command()
        if cmd and "JobID,State,NodeList" in cmd:
            cmd[cmd.index("JobID,State,NodeList")] = "JobID,State,ExitCode,NodeList"
        return cmd


@contextlib.contextmanager
def _quiet_submitit() -> Iterator[None]:
    """Without accounting, sacct writes its error to our stderr (submitit does not capture
    it) and submitit logs 'Bypassing sacct error' to stdout and stderr; orch falls back and
    names its source instead, so both are muted for the one sacct call."""
    log = logging.getLogger("submitit")
    level = log.level
    log.setLevel(logging.ERROR)
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
        log.setLevel(level)


def run_command(cmd: list[str], timeout: float = 20) -> subprocess.CompletedProcess[str] | None:
    """A Slurm client command (squeue, scontrol, scancel, sacct), None when it cannot run or hangs:
    the callers fall back to another source instead of failing."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None


def normalize_state(state: str) -> str:
    """`CANCELLED by 123`, `COMPLETED+`: the bare state name."""
    s = state.split()[0].rstrip("+") if state.strip() else "UNKNOWN"
    return "CANCELLED" if s.startswith("CANCELLED") else s


def scheduler_state(job_id: str) -> dict[str, Any]:
    """{'state', 'source', 'nodes', 'exit_code', 'steps'}: submitit's sacct watcher, else
    squeue, else scontrol."""
    with _quiet_submitit():
        info = _Watcher(delay_s=0).get_info(job_id, mode="force")
    if info.get("State"):
        return {"state": normalize_state(info["State"]), "exit_code": info.get("ExitCode"),
                "nodes": info.get("NodeList"), "steps": [], "source": "sacct"}
    q = run_command(["squeue", "-h", "-j", job_id, "-o", "%T|%N"])
    if q is not None and q.returncode == 0 and q.stdout.strip():
        state, _, nodes = q.stdout.strip().splitlines()[0].partition("|")
        if normalize_state(state) not in TERMINAL:
            return {"state": normalize_state(state), "nodes": nodes, "steps": [], "source": "squeue"}
    c = run_command(["scontrol", "show", "job", job_id])
    if c is not None and c.returncode == 0:
        m = re.search(r"JobState=(\S+)", c.stdout)
        ec = re.search(r"ExitCode=(\S+)", c.stdout)
        nodes = re.search(r"\bNodeList=(\S+)", c.stdout)
        if m:
            return {"state": normalize_state(m.group(1)), "exit_code": ec.group(1) if ec else None,
                    "nodes": nodes.group(1) if nodes else None, "steps": [], "source": "scontrol"}
    return {"state": "UNKNOWN", "steps": [], "source": "none (job no longer known to Slurm)"}


class SlurmBackend(SubmititBackend):
    name = "slurm"

    def make_executor(self, job: ResolvedJob, folder: Path) -> submitit.Executor:
        s = job.slurm
        ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
        params: dict[str, Any] = {
            "job_name": job.spec.name, "nodes": job.nodes, "ntasks_per_node": 1,
            "time": slurm_minutes(s.time), "signal_delay_s": job_stop_timing(job).lead_s,
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

    def state(self, folder: Path, job_id: str, tasks: list[dict[str, Any]]) -> dict[str, Any]:
        state = scheduler_state(job_id)
        # A job Slurm has forgotten (no accounting, past MinJobAge) is judged by its tasks.
        if state["state"] == "UNKNOWN" and all(t["result"] != "pending" for t in tasks):
            state["state"] = "COMPLETED" if all(t["result"] == "success" for t in tasks) else "FAILED"
            state["source"] += "; submitit results"
        # The node supervisors end a job at the time limit's early warning, or at `orch cancel`'s,
        # before Slurm does: Slurm then records how the processes ended, orch says why.
        stops = [read_json(stop_file(folder, job_id, t["task"])) for t in tasks]
        if state["state"] in ("FAILED", "COMPLETED") and cancel_file(folder, job_id).exists():
            state["state"] = "CANCELLED"
            state["source"] += "; orch cancel"
        elif state["state"] == "FAILED" and (any(s.get("reason") == "timeout" for s in stops) or any(
                said in tail(Path(t["stderr"]), 200) for t in tasks for said in TIMED_OUT)):
            state["state"] = "TIMEOUT"
            state["source"] += "; time-limit warning"
        stop = next((s for s in stops if s), None)
        if stop and stop.get("reason") == "cancelled" and state["state"] != "CANCELLED":
            # A SIGTERM that orch did not send: srun ending the step because another node's
            # task failed (--kill-on-bad-exit), not a cancel.
            stop = {**stop, "reason": "step_ended"}
        if stop:
            state["stop"] = stop
        return state

    def cancel(self, folder: Path, job_id: str) -> list[str]:
        """The early warning first (`scancel --signal=USR2`: every node stops its captures), then,
        once the job ended or its grace ran out, `scancel`."""
        with contextlib.suppress(OSError):
            cancel_file(folder, job_id).touch()
        if _running(job_id):
            run_command(["scancel", "--signal=USR2", job_id])
            sup = read_json(supervisor_file(folder, job_id, 0))
            deadline = time.monotonic() + sup.get("grace_s", 60) + SETTLE_S + KILL_WAIT_S + 10
            while time.monotonic() < deadline and scheduler_state(job_id)["state"] not in TERMINAL:
                time.sleep(1)
        p = run_command(["scancel", job_id])
        if p is None or p.returncode != 0:
            raise OrchError(f"scancel {job_id} failed: {(p.stderr.strip() if p else 'scancel not found')}")
        return []


# What a task's log says when the time limit's early warning ended it: the supervisor's line, or
# srun's for a task the signal killed before its supervisor could take it (Slurm may send the
# warning up to a minute early, so a job of a few minutes can get it while its tasks start).
TIMED_OUT = ("this job is timed-out", "User defined signal 2")


def _running(job_id: str) -> bool:
    """Whether the job runs now. squeue asks slurmctld; sacct (scheduler_state's first source)
    learns of a job's start through slurmdbd a moment later and can still say PENDING for a job
    whose ranks already run, and a cancel that skipped the early warning then loses every report."""
    q = run_command(["squeue", "-h", "-j", job_id, "-o", "%T"])
    if q is not None and q.returncode == 0 and q.stdout.strip():
        return normalize_state(q.stdout.strip().splitlines()[0]) == "RUNNING"
    return scheduler_state(job_id)["state"] == "RUNNING"



def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
