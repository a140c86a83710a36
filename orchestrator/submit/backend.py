"""Submit backends behind one small protocol: submit, state, cancel, task results.

Both backends run the rendered per-node launch through submitit (under `node.NodeCommand`, the
supervisor that stops it in order; the same command `sbatch.sh` gives to srun) and read each
task's outcome from submitit's own files (`JobPaths`: result pickle, stdout, stderr), so no
file name is re-derived here. What differs per backend (the executor, where the job state
comes from, how to cancel) lives in `slurm.py` and `local.py`; `core.backend_for(executor)` is the
one place that picks between them.
"""

from __future__ import annotations

import contextlib
import io
import pickle
import subprocess
from pathlib import Path
from typing import Any, Protocol

import submitit
from submitit.core.utils import FailedJobError, JobPaths

from orchestrator.errors import OrchError
from orchestrator.limits import StopTiming, stop_timing
from orchestrator.render import Rendered
from orchestrator.spec import ResolvedJob
from orchestrator.submit.failure import failed_at, failure_line, rank_traceback, root_cause
from orchestrator.submit.node import NodeCommand

# Slurm's terminal states; the local backend reports a subset of them.
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


class Backend(Protocol):
    """What `orch submit/status/cancel` need from a scheduler."""

    name: str

    def preflight(self, job: ResolvedJob) -> None:
        """Check what can be checked before anything is created; raise OrchError with the fix."""
        ...

    def submit(self, job: ResolvedJob, rendered: Rendered, folder: Path) -> str:
        """Submit one task per node; returns the job id."""
        ...

    def ntasks(self, nodes: int) -> int:
        """How many submitit tasks a job of `nodes` nodes has."""
        ...

    def task_results(self, folder: Path, job_id: str, ntasks: int) -> list[dict[str, Any]]:
        """Per task: 'success' / 'error' (why, and the failing rank's traceback when it printed one) /
        'pending', and its log paths."""
        ...

    def state(self, folder: Path, job_id: str, tasks: list[dict[str, Any]]) -> dict[str, Any]:
        """{'state', 'source', ...}: never stuck at UNKNOWN once the tasks have reported."""
        ...

    def cancel(self, folder: Path, job_id: str) -> list[str]:
        """Stop the job in order (captures first); returns the pids it had to kill itself."""
        ...


class SubmititBackend:
    """What both backends share: submission through a submitit executor, and task results
    from submitit's result pickles."""

    name = "submitit"
    enforces_limit = False  # the local executor enforces the time limit itself; Slurm does on Slurm
    # The local executor's job starts from the shell `orch submit` runs in and leaves its terminal
    # (node.NodeCommand.own_session); a Slurm task is slurmstepd's, in a session it owns.
    leaves_terminal = False

    def make_executor(self, job: ResolvedJob, folder: Path) -> submitit.Executor:
        raise NotImplementedError

    def preflight(self, job: ResolvedJob) -> None:
        """What can be checked before anything is created or submitted; raises OrchError. A Slurm
        job's python lives on its nodes, out of reach from here: nothing to check."""

    def ntasks(self, nodes: int) -> int:
        return nodes

    def submit(self, job: ResolvedJob, rendered: Rendered, folder: Path) -> str:
        ex = self.make_executor(job, folder)
        fn = NodeCommand(rendered.node_command, cwd=str(rendered.script_dir.parent), folder=str(folder),
                         timing=job_stop_timing(job), enforce_limit=self.enforces_limit,
                         own_session=self.leaves_terminal, nodes=self.ntasks(job.nodes))
        try:
            # submitit echoes sbatch's stderr itself; it is folded into our one-line error instead.
            with contextlib.redirect_stderr(io.StringIO()):
                return str(ex.submit(fn).job_id)
        except FailedJobError as e:
            lines = [ln.strip().removeprefix("sbatch: error:").strip() for ln in str(e).splitlines() if ln.strip()]
            raise OrchError(f"sbatch rejected the job: {'; '.join(lines) or 'no message'}") from None
        except (subprocess.CalledProcessError, OSError) as e:
            raise OrchError(f"could not submit the job ({e}); check that sbatch works on this host") from None

    def task_results(self, folder: Path, job_id: str, ntasks: int) -> list[dict[str, Any]]:
        out = []
        for t in range(ntasks):
            paths = JobPaths(folder, job_id=job_id, task_id=t)
            info: dict[str, Any] = {"task": t, "stdout": str(paths.stdout), "stderr": str(paths.stderr)}
            if paths.result_pickle.exists():
                try:
                    with open(paths.result_pickle, "rb") as fh:
                        outcome, value = pickle.load(fh)
                    info["result"] = outcome
                    if outcome == "error":
                        text = str(value).strip()
                        info["error"] = failure_line(text) or (text.splitlines()[-1][:300] if text else "")
                        info["traceback"] = rank_traceback(text)
                        cause = root_cause(text)
                        if cause:
                            info["failed_rank"], info["failed_exit"], info["failed_by_peer"] = cause
                            info["failed_at"] = failed_at(text)
                except Exception as e:  # a half-written or foreign pickle: say so, keep going
                    info["result"] = f"unreadable ({e.__class__.__name__})"
            else:
                info["result"] = "pending"
            out.append(info)
        return out


def job_stop_timing(job: ResolvedJob) -> StopTiming:
    p = job.spec.profile
    return stop_timing(job.slurm.time, p.warn_lead_s, p.stop_grace_s)


def tail(path: Path, lines: int = 15) -> str:
    """The last lines of a log (at most its last 8 KiB), '' when it does not exist."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 8192))
            return "\n".join(fh.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
