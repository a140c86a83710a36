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
- on a job of several nodes, tells the others when its node's launch failed
  (`<folder>/<job>_failed.json`) and, before failing itself, waits until every node's launch
  has ended (`<job>_<node>_ended.json`, up to the stop's grace): srun ends the step as soon as one
  task fails (`--kill-on-bad-exit`) and Slurm SIGKILLs what is left `KillWait` later, which can
  be too soon for the other nodes' nsys to write their reports. A supervisor that sees another
  node's failure stops its captures as a cancel does (stop reason `step_ended`);
- at the time limit (local) or when a stop outlasts its grace, sends SIGTERM then SIGKILL
  to every descendant, and before returning kills whatever is left, so nothing outlives it;
- writes why it stopped (`<folder>/<job>_<node>_stop.json`) for `orch status`, and its own pid
  (`<folder>/<job>_<node>_supervisor.json`) for `orch cancel`;
- on the local executor, leaves the terminal `orch submit` ran in (`own_session`): the job
  outlives that command and is stopped by `orch cancel`, never by a Ctrl-C meant for orch.
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

from orchestrator.limits import KILL_WAIT_S, StopTiming

_PR_SET_CHILD_SUBREAPER = 36
_POLL_S = 0.2
_PEERS_POLL_S = 1.0  # the other nodes' markers, on the shared filesystem
SETTLE_S = 10  # after launch.sh ends, how long its leftovers may take to exit before SIGKILL
# What a terminal sends its foreground process group (Ctrl-C, Ctrl-\, Ctrl-Z, a hangup, a background
# read or write): `orch submit` starts submitit's controller with these ignored, and an ignored
# disposition is inherited down to the ranks unless reset.
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


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


def _named(pids: list[int], most: int = 8) -> str:
    """`pid 123 (nsys), pid 130 (python)`: which processes the supervisor stops, so that the log
    says whether it was a rank's program or nsys' agent that outlived the launch."""
    names = []
    for pid in pids[:most]:
        try:
            names.append(f"pid {pid} ({Path(f'/proc/{pid}/comm').read_text().strip()})")
        except OSError:
            names.append(f"pid {pid} (ended)")
    return ", ".join(names) + (f" and {len(pids) - most} more" if len(pids) > most else "")


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


def cancel_file(folder: Path, job_id: str) -> Path:
    """Made by `orch cancel` before it signals the job: its stop is a cancel, whatever signal
    carries it, and a job that then ends reads CANCELLED."""
    return folder / f".{job_id}.cancelled"


def failed_file(folder: Path, job_id: str) -> Path:
    """Made by the first node whose launch failed (its node and status), for the others."""
    return folder / f"{job_id}_failed.json"


def ended_file(folder: Path, job_id: str, node: str | int) -> Path:
    """Written by every node once its launch ended and its leftovers are gone."""
    return folder / f"{job_id}_{node}_ended.json"


def ended_nodes(folder: Path, job_id: str) -> set[str]:
    """The nodes that wrote their ended_file: one listing of the folder, not a stat per node
    (a shared filesystem's metadata server serves every node of the job)."""
    head, tail = f"{job_id}_", "_ended.json"
    try:
        names = os.listdir(folder)
    except OSError:
        return set()
    return {n[len(head):-len(tail)] for n in names if n.startswith(head) and n.endswith(tail)}


def _mark_failed(folder: Path, job_id: str, node: str, rc: int) -> None:
    """failed_file, unless another node made it first."""
    with contextlib.suppress(FileExistsError, OSError):
        fd = os.open(failed_file(folder, job_id), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps({"node": node, "rc": rc, "at_utc_ns": time.time_ns()}))


class NodeCommand:
    """Run the node's launch command under the stop order above (picklable for submitit)."""

    def __init__(self, command: list[str], cwd: str, folder: str, timing: StopTiming,
                 enforce_limit: bool, nodes: int = 1, own_session: bool = False) -> None:
        self.command = command
        self.cwd = cwd
        self.folder = folder
        self.timing = timing
        self.enforce_limit = enforce_limit  # the local executor; on Slurm, Slurm enforces it
        self.nodes = nodes  # node tasks of the job, each under a supervisor of its own
        # Leave orch's session first: the local executor's job starts inside it. Never on Slurm,
        # whose slurmstepd owns the task's session and process group.
        self.own_session = own_session

    def __call__(self) -> str:
        if self.own_session:
            self._leave_the_terminal()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        job, node = _job_and_node()
        folder = Path(self.folder)
        me = os.getpid()
        supervisor_file(folder, job, node).write_text(json.dumps({"pid": me, "start": start_time(me),
                                                                 "grace_s": self.timing.grace_s}))
        requests: list[tuple[str, int, str]] = []  # why, the signal, the stop's reason
        for sig, why in ((signal.SIGUSR2, "time-limit warning"), (signal.SIGTERM, "cancelled"),
                         (signal.SIGINT, "cancelled")):
            reason = "timeout" if sig == signal.SIGUSR2 else "cancelled"
            signal.signal(sig, lambda _s, _f, why=why, sig=sig, reason=reason: requests.append((why, sig, reason)))
        t0 = time.monotonic()
        proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, cwd=self.cwd, start_new_session=True)
        out, err = io.StringIO(), io.StringIO()
        copier = threading.Thread(target=copy_process_streams, args=(proc, out, err, True), daemon=True)
        copier.start()
        stop: dict[str, Any] = {}
        term_at = kill_at = None
        warn_at = t0 + self.timing.limit_s - self.timing.lead_s if self.enforce_limit else None
        peers_at = t0
        limit_at = t0 + self.timing.limit_s if self.enforce_limit else None
        while proc.poll() is None:
            now = time.monotonic()
            if warn_at is not None and now >= warn_at and not stop:
                requests.append(("time-limit warning", signal.SIGUSR2, "timeout"))
            if self.nodes > 1 and not requests and not stop and now >= peers_at:
                peers_at = now + _PEERS_POLL_S
                if failed_file(folder, job).exists():
                    requests.append(("another node failed", signal.SIGTERM, "step_ended"))
            if requests and not stop:
                stop, sig = self._record_stop(requests[0], folder, job, node, now - t0)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGUSR2 if sig == signal.SIGUSR2 else signal.SIGTERM)
                if stop["reason"] != "timeout":
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
        if requests and not stop:
            # Slurm signals every process of the step: the launch command can end on the signal
            # before this loop's next turn, and the stop is still the signal's.
            stop, _ = self._record_stop(requests[0], folder, job, node, time.monotonic() - t0)
        if rc and self.nodes > 1:
            _mark_failed(folder, job, node, rc)
        self._end_leftovers(me)
        copier.join(timeout=5)
        if self.nodes > 1:
            ended_file(folder, job, node).write_text(json.dumps({"rc": rc}))
            if rc:
                self._wait_for_the_others(folder, job)
        if rc:
            raise FailedJobError(err.getvalue().strip()) from subprocess.CalledProcessError(rc, self.command)
        return out.getvalue().strip()

    def _record_stop(self, request: tuple[str, int, str], folder: Path, job: str, node: str,
                     after_s: float) -> tuple[dict[str, Any], int]:
        """Say why the node stops and write its stop file, which `orch status` reads to tell a
        timeout or a cancel from a failure: the stop and the signal to pass on."""
        why, sig, reason = request
        if reason == "timeout" and cancel_file(folder, job).exists():
            # `orch cancel` on Slurm sends the early warning's signal, for the same stop.
            why, reason = "orch cancel", "cancelled"
        stop = {"reason": reason, "signal": signal.Signals(sig).name, "after_s": round(after_s, 1),
                "at_utc_ns": time.time_ns()}
        self._say(f"{why} ({signal.Signals(sig).name}): asking launch.sh to stop the captures"
                  + (" - this job is timed-out" if reason == "timeout" else ""))
        stop_file(folder, job, node).write_text(json.dumps(stop))
        return stop, sig

    @staticmethod
    def _leave_the_terminal() -> None:
        """On the local executor this process starts in the session and process group of the
        `orch submit` that started submitit's controller, with the terminal's signals ignored
        (so that none of them reached it on the way). A session of its own takes it and all it
        starts out of that terminal's reach (a Ctrl-C, a hangup, a closed window): the job is
        stopped by `orch cancel`, in order. The signals are then given back their defaults,
        for launch.sh's traps (bash cannot trap a signal ignored when it started) and the ranks."""
        with contextlib.suppress(OSError):  # already a session leader: nothing to leave
            os.setsid()
        for sig in TERMINAL_SIGNALS:
            signal.signal(sig, signal.SIG_DFL)

    def _wait_for_the_others(self, folder: Path, job: str) -> None:
        """Before this task fails (and srun ends the step), until every node's launch has ended:
        the others stop their captures on this node's failure, which takes up to the grace."""
        deadline = time.monotonic() + self.timing.grace_s + 2 * (SETTLE_S + KILL_WAIT_S) + 5
        every = {str(n) for n in range(self.nodes)}
        waiting = sorted(every - ended_nodes(folder, job), key=int)
        if waiting:
            self._say(f"waiting for node(s) {', '.join(waiting)} to stop their captures before this node fails "
                      "(srun then ends the job)")
        while waiting and time.monotonic() < deadline:
            time.sleep(_PEERS_POLL_S)
            waiting = sorted(every - ended_nodes(folder, job), key=int)
        if waiting:
            self._say(f"node(s) {', '.join(waiting)} still running after the stop's grace: failing now")

    def _end_leftovers(self, me: int) -> None:
        """launch.sh waited for its nsys; what remains (a rank torchrun could not stop, nsys'
        agent still writing) gets a few seconds, then SIGTERM (nsys' agent shares state with
        every nsys of the machine: it is asked before it is killed), then SIGKILL until none
        is left."""
        for sig, wait_s in ((0, SETTLE_S), (signal.SIGTERM, KILL_WAIT_S)):
            left = descendants(me)
            if left and sig:
                self._say(f"{len(left)} process(es) still running after the launch ended: "
                          f"{signal.Signals(sig).name} to {_named(left)}")
                signal_tree(me, sig)
            deadline = time.monotonic() + wait_s
            while descendants(me) and time.monotonic() < deadline:
                _reap()
                time.sleep(_POLL_S)
        left = descendants(me)
        if left:
            self._say(f"{len(left)} process(es) still running after SIGTERM: SIGKILL to {_named(left)}")
        for _ in range(50):
            if not signal_tree(me, signal.SIGKILL):
                break
            _reap()
            time.sleep(_POLL_S)
        _reap()

    @staticmethod
    def _say(msg: str) -> None:
        print(f"orch: node supervisor: {msg}", file=sys.stderr, flush=True)
