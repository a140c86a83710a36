"""The per-node supervisor submitit runs in place of its `CommandFunction`.

submitit's own answer to a time limit is to raise inside its task and SIGKILL the command's
process (here torchrun): the ranks run in sessions of their own (torchrun starts each with
setsid), so they outlive the job with no parent, and no nsys is ever asked to stop, so no
report is written. This supervisor instead:
- becomes the subreaper of everything it starts, so every process of the job, orphans and
  nsys' own daemon included, stays its descendant and can be found by pid;
- turns the early warning (SIGUSR2: Slurm's `--signal`, or its own clock on the local
  executor) into a SIGUSR2 to the node's launch.sh, which stops the captures in order;
- turns a cancel (SIGTERM/SIGINT) into a SIGTERM to launch.sh, which does the same;
- at the time limit (local) or when a stop outlasts its grace, sends SIGTERM then SIGKILL
  to every descendant, and before returning kills whatever is left, so nothing outlives it;
- writes why it stopped (`<folder>/<job>_<node>_stop.json`) for `orch status`, and its own pid
  (`<folder>/<job>_<node>_supervisor.json`) for `orch cancel`.
It fails as `CommandFunction` does (FailedJobError carrying the command's stderr), so the
task's result reads the same.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from submitit.core.utils import FailedJobError, copy_process_streams

from orchestrator.submit.limits import KILL_WAIT_S, StopTiming

_PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.2
SETTLE_S = 10  # after launch.sh ends, how long its leftovers may take to exit before SIGKILL


def descendants(root: int) -> list[int]:
    """Every live process below `root` in the parent tree (by /proc's ppid), deepest first."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = Path(f"/proc/{d}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":  # a zombie is dead already; its parent reaps it
            continue
        children.setdefault(int(fields[1]), []).append(int(d))
    out: list[int] = []
    todo = [root]
    while todo:
        pid = todo.pop()
        kids = children.get(pid, [])
        out.extend(kids)
        todo.extend(kids)
    return out[::-1]


def signal_tree(root: int, sig: int) -> int:
    """Send `sig` to every descendant of `root`; returns how many there were."""
    pids = descendants(root)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    return len(pids)


def _reap(keep: int | None = None) -> None:
    """Collect adopted orphans that have exited, by pid: never `keep` (the launch, which Popen
    waits for: a status taken from under it would read as success)."""
    me = os.getpid()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == keep:
            continue
        try:
            fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == me:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(int(d), os.WNOHANG)


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat): with the pid, it
    names one process even after the pid is reused."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _job_and_node() -> tuple[str, str]:
    job = os.environ.get("SLURM_JOB_ID") or os.environ.get("SUBMITIT_LOCAL_JOB_ID") or str(os.getpid())
    return job, os.environ.get("SLURM_NODEID", "0")


def stop_file(folder: Path, job_id: str, node: str | int) -> Path:
    return folder / f"{job_id}_{node}_stop.json"


def supervisor_file(folder: Path, job_id: str, node: str | int) -> Path:
    return folder / f"{job_id}_{node}_supervisor.json"


class NodeCommand:
    """Run the node's launch command under the stop order above (picklable for submitit)."""

    def __init__(self, command: list[str], cwd: str, folder: str, timing: StopTiming,
                 enforce_limit: bool) -> None:
        self.command = command
        self.cwd = cwd
        self.folder = folder
        self.timing = timing
        self.enforce_limit = enforce_limit  # the local executor; on Slurm, Slurm enforces it

    def __call__(self) -> str:
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        job, node = _job_and_node()
        folder = Path(self.folder)
        me = os.getpid()
        supervisor_file(folder, job, node).write_text(json.dumps({"pid": me, "start": start_time(me),
                                                                 "grace_s": self.timing.grace_s}))
        requests: list[tuple[str, int]] = []
        for sig, why in ((signal.SIGUSR2, "time-limit warning"), (signal.SIGTERM, "cancelled"),
                         (signal.SIGINT, "cancelled")):
            signal.signal(sig, lambda _s, _f, why=why, sig=sig: requests.append((why, sig)))
        t0 = time.monotonic()
        proc = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=self.cwd,
                                start_new_session=True)
        out, err = io.StringIO(), io.StringIO()
        copier = threading.Thread(target=copy_process_streams, args=(proc, out, err, True), daemon=True)
        copier.start()
        stop: dict[str, Any] = {}
        term_at = kill_at = None
        warn_at = t0 + self.timing.limit_s - self.timing.lead_s if self.enforce_limit else None
        limit_at = t0 + self.timing.limit_s if self.enforce_limit else None
        while proc.poll() is None:
            now = time.monotonic()
            if warn_at is not None and now >= warn_at and not stop:
                requests.append(("time-limit warning", signal.SIGUSR2))
            if requests and not stop:
                why, sig = requests[0]
                stop = {"reason": "timeout" if sig == signal.SIGUSR2 else "cancelled",
                        "signal": signal.Signals(sig).name, "after_s": round(now - t0, 1),
                        "at_utc_ns": time.time_ns()}
                self._say(f"{why} ({signal.Signals(sig).name}): asking launch.sh to stop the captures"
                          + (" - this job is timed-out" if stop["reason"] == "timeout" else ""))
                stop_file(folder, job, node).write_text(json.dumps(stop))
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGUSR2 if sig == signal.SIGUSR2 else signal.SIGTERM)
                if stop["reason"] == "cancelled":
                    term_at = now + self.timing.grace_s + SETTLE_S
            if limit_at is not None and now >= limit_at and term_at is None:
                term_at = now
            if term_at is not None and now >= term_at and kill_at is None:
                n = signal_tree(me, signal.SIGTERM)
                self._say(f"stop deadline reached: SIGTERM to the {n} process(es) left")
                stop.setdefault("reason", "timeout")
                stop["terminated"] = n
                stop_file(folder, job, node).write_text(json.dumps(stop))
                kill_at = now + KILL_WAIT_S
            if kill_at is not None and now >= kill_at:
                signal_tree(me, signal.SIGKILL)
            _reap(keep=proc.pid)
            time.sleep(_POLL_S)
        rc = proc.wait()
        self._end_leftovers(me)
        copier.join(timeout=5)
        if rc:
            raise FailedJobError(err.getvalue().strip()) from subprocess.CalledProcessError(rc, self.command)
        return out.getvalue().strip()

    def _end_leftovers(self, me: int) -> None:
        """launch.sh waited for its nsys; what remains (a rank torchrun could not stop, nsys'
        agent still writing) gets a few seconds, then SIGTERM (nsys' agent shares state with
        every nsys of the machine: it is asked before it is killed), then SIGKILL until none
        is left."""
        for sig, wait_s in ((0, SETTLE_S), (signal.SIGTERM, KILL_WAIT_S)):
            left = descendants(me)
            if left and sig:
                self._say(f"{len(left)} process(es) still running after the launch ended: {signal.Signals(sig).name}")
                signal_tree(me, sig)
            deadline = time.monotonic() + wait_s
            while descendants(me) and time.monotonic() < deadline:
                _reap()
                time.sleep(_POLL_S)
        left = descendants(me)
        if left:
            self._say(f"{len(left)} process(es) still running after SIGTERM: SIGKILL")
        for _ in range(50):
            if not signal_tree(me, signal.SIGKILL):
                break
            _reap()
            time.sleep(_POLL_S)
        _reap()

    @staticmethod
    def _say(msg: str) -> None:
        print(f"orch: node supervisor: {msg}", file=sys.stderr, flush=True)
