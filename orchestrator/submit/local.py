"""The local backend: submitit's `LocalExecutor` on this machine.

submitit's `LocalJob` only knows its process inside the Python that submitted it; `orch
status` runs later in another process, so the state comes from the controller's pid (the
job id) and submitit's result files; the node supervisor (`node.py`) says why it stopped the
job (time limit, cancel), and a cancel leaves a marker of its own so it reads CANCELLED even
when the supervisor could not write.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import submitit

from orchestrator.errors import OrchError
from orchestrator.limits import KILL_WAIT_S
from orchestrator.render import Rendered
from orchestrator.spec import ResolvedJob
from orchestrator.submit.backend import SubmititBackend, job_stop_timing
from orchestrator.submit.node import (
    SETTLE_S,
    TERMINAL_SIGNALS,
    cancel_file,
    descendants,
    signal_tree,
    start_time,
    stop_file,
    supervisor_file,
)

# Exits 1 where torch cannot be imported: its spec only, not the import (seconds of CPU).
HAS_TORCH = "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is None)"


class LocalBackend(SubmititBackend):
    name = "local"
    enforces_limit = True
    leaves_terminal = True

    def make_executor(self, job: ResolvedJob, folder: Path) -> submitit.Executor:
        ex = submitit.LocalExecutor(folder=folder)
        # The node supervisor enforces the time limit; submitit's controller, which would SIGKILL
        # the supervisor and orphan the ranks, is given the limit plus the whole stop order (and
        # no early signal of its own: the supervisor sends it).
        t = job_stop_timing(job)
        budget_s = t.limit_s + t.grace_s + KILL_WAIT_S + SETTLE_S + 60
        # LocalExecutor exports CUDA_VISIBLE_DEVICES from gpus_per_node (0 hides all GPUs).
        ex.update_parameters(timeout_min=-(-budget_s // 60), signal_delay_s=0, nodes=1, tasks_per_node=1,
                             gpus_per_node=job.gpus_per_node)
        return ex

    def preflight(self, job: ResolvedJob) -> None:
        """The job runs here, so its python is checked before a job is made of it: torchrun runs
        as `python -m torch.distributed.run`, and a python without torch (the shell's python3
        where the training environment is a virtualenv not activated) would fail every node at
        once, with no fix in sight."""
        python = job.spec.launch.python or job.cluster.python
        where = ("`launch.python` in the job file" if job.spec.launch.python
                 else f"`launch.python` in the job file (or `python:` in cluster config {job.cluster.name})")
        ours = f" (orch's own has it: {sys.executable})" if importlib.util.find_spec("torch") else ""
        exe = shutil.which(python, path=job.env.get("PATH", os.environ.get("PATH")))
        if exe is None:
            raise OrchError(f"the job's python `{python}` is not on this machine's PATH: set {where} to your "
                            f"training environment's interpreter{ours}")
        try:
            p = subprocess.run([exe, "-c", HAS_TORCH], capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise OrchError(f"the job's python `{python}` ({exe}) does not run: {e}; set {where} to your training "
                            f"environment's interpreter{ours}") from None
        if p.returncode == 1:
            raise OrchError(f"the job's python `{python}` ({exe}) has no torch, which torchrun needs: set {where} "
                            "to the interpreter of the environment you train in, or activate that environment before "
                            f"`orch submit`{ours}")

    def submit(self, job: ResolvedJob, rendered: Rendered, folder: Path) -> str:
        """Start submitit's controller detached from what `orch submit` runs in.

        The controller outlives `orch submit` and inherits its stdin, stdout, stderr, process
        group and signal dispositions. Its output goes to a file of its own: when stdout is a
        pipe (`orch submit ... | tee`, a test harness) the controller would die once the reader
        goes, taking the job's bookkeeping with it. Its stdin is /dev/null: nothing of the job
        holds the terminal open or reads from it. And it starts with the terminal's signals
        ignored: in orch's process group it gets the terminal's Ctrl-C, on which it would SIGKILL
        the node supervisor a second later (orphaning the ranks, the job then reading FAILED).
        An ignored signal stays ignored across fork and exec, and Python installs no
        KeyboardInterrupt handler for a SIGINT ignored at its start; the supervisor, in a session
        of its own, gives the signals back their defaults for the launch and the ranks."""
        folder.mkdir(parents=True, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        saved = [_saved_fd(fd) for fd in (0, 1, 2)]
        log = _above_stdio(os.open(folder / "controller.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
        null = _above_stdio(os.open(os.devnull, os.O_RDONLY))
        # Only the main thread may set handlers (orch's CLI submits from it; a library caller may not).
        main = threading.current_thread() is threading.main_thread()
        handlers = {sig: signal.getsignal(sig) for sig in TERMINAL_SIGNALS} if main else {}
        try:
            for sig in handlers:
                signal.signal(sig, signal.SIG_IGN)
            os.dup2(null, 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            return super().submit(job, rendered, folder)
        finally:
            for fd, old in enumerate(saved):
                if old is None:  # it was closed: closed again
                    os.close(fd)
                else:
                    os.dup2(old, fd)
                    os.close(old)
            os.close(log)
            os.close(null)
            for sig, handler in handlers.items():
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)

    def ntasks(self, nodes: int) -> int:
        return 1  # one machine, one controller task

    def state(self, folder: Path, job_id: str, tasks: list[dict[str, Any]]) -> dict[str, Any]:
        alive = _alive(job_id)
        results = {t["result"] for t in tasks}
        stop = read_stop(folder, job_id)
        if alive and "pending" in results:
            state = "RUNNING"
        elif results == {"success"}:
            state = "COMPLETED"
        elif cancel_file(folder, job_id).exists() or stop.get("reason") == "cancelled":
            state = "CANCELLED"
        elif stop.get("reason") == "timeout":
            state = "TIMEOUT"
        else:
            state = "FAILED"
        return {"state": state, "steps": [], "source": "local controller", **({"stop": stop} if stop else {})}

    def cancel(self, folder: Path, job_id: str) -> list[str]:
        """Stop the job in order and wait for it; returns what had to be killed by pid."""
        cancel_file(folder, job_id).touch()
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(job_id), signal.SIGTERM)  # the controller forwards it to the node supervisor
        sup = _supervisor(folder, job_id)
        wait_s = (sup or {}).get("grace_s", 60) + SETTLE_S + KILL_WAIT_S + 10
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and (_alive(job_id) or (sup and _same(sup))):
            time.sleep(0.3)
        killed: list[str] = []
        if sup and _same(sup):  # the supervisor outlived its grace: end its tree, then it
            pids = descendants(sup["pid"])
            signal_tree(sup["pid"], signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                os.kill(sup["pid"], signal.SIGKILL)
            killed = [str(p) for p in [*pids, sup["pid"]]]
        return killed


def _saved_fd(fd: int) -> int | None:
    """A copy of `fd` to put back afterwards; None when it is closed (a command run with
    `<&-`)."""
    try:
        return _above_stdio(os.dup(fd))
    except OSError:
        return None


def _above_stdio(fd: int) -> int:
    """`fd` moved above 2: with a standard descriptor closed, `os.open` returns it, and the
    dup2 onto that descriptor would then close the file."""
    if fd > 2:
        return fd
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return high


def read_stop(folder: Path, job_id: str) -> dict[str, Any]:
    """Why the node supervisor stopped the job ({} when it ended by itself)."""
    try:
        return json.loads(stop_file(folder, job_id, 0).read_text())
    except (OSError, ValueError):
        return {}


def _supervisor(folder: Path, job_id: str) -> dict[str, Any] | None:
    try:
        return json.loads(supervisor_file(folder, job_id, 0).read_text())
    except (OSError, ValueError):
        return None


def _same(sup: dict[str, Any]) -> bool:
    """Is the recorded supervisor still that process (same pid, same start time)?"""
    return start_time(int(sup["pid"])) == sup.get("start") and _proc_state(str(sup["pid"])) != "Z"


def _alive(job_id: str) -> bool:
    try:
        os.kill(int(job_id), 0)
        return Path(f"/proc/{job_id}").exists() and "Z" not in _proc_state(job_id)
    except (ProcessLookupError, ValueError, OverflowError):
        return False
    except PermissionError:
        return True



def _proc_state(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][:1]
    except (OSError, IndexError):
        return "Z"
