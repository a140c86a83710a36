"""The local backend: submitit's `LocalExecutor` on this machine.

submitit's `LocalJob` only knows its process inside the Python that submitted it; `orch
status` runs later in another process, so the state comes from the controller's pid (the
job id) and submitit's result files, and a cancel leaves a marker so it reads CANCELLED.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import JobPaths

from orchestrator.spec import ResolvedJob
from orchestrator.submit.backend import SubmititBackend
from orchestrator.submit.slurm import slurm_minutes


class LocalBackend(SubmititBackend):
    name = "local"

    def make_executor(self, job: ResolvedJob, folder: Path) -> submitit.Executor:
        ex = submitit.LocalExecutor(folder=folder)
        # LocalExecutor exports CUDA_VISIBLE_DEVICES from gpus_per_node (0 hides all GPUs).
        ex.update_parameters(timeout_min=slurm_minutes(job.slurm.time), nodes=1, tasks_per_node=1,
                             gpus_per_node=job.gpus_per_node)
        return ex

    def ntasks(self, nodes: int) -> int:
        return 1  # one machine, one controller task

    def state(self, folder: Path, job_id: str, tasks: list[dict[str, Any]]) -> dict[str, Any]:
        try:
            os.kill(int(job_id), 0)
            alive = Path(f"/proc/{job_id}").exists() and "Z" not in _proc_state(job_id)
        except (ProcessLookupError, ValueError, OverflowError):
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
            state = "CANCELLED" if _cancel_marker(folder, job_id).exists() else "FAILED"
        return {"state": state, "steps": [], "source": "local controller"}

    def cancel(self, folder: Path, job_id: str) -> None:
        _cancel_marker(folder, job_id).touch()
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(job_id), signal.SIGTERM)  # the controller forwards it to its tasks


def _cancel_marker(folder: Path, job_id: str) -> Path:
    return JobPaths(folder, job_id=job_id).folder / f".{job_id}.cancelled"


def _proc_state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1]
    except (OSError, IndexError):
        return "Z"
