"""Ctrl-C during `orch submit --wait`, typed in a pseudo-terminal as a person types it, on the local
executor and on the local Slurm (real torchrun, gloo on CPU, real nsys).

Once: orch stops following, says the job goes on and how to stop it, exits 130; the job is left
running (`orch status` says RUNNING while its ranks run) until `orch cancel` stops it in order,
every rank's report kept. Twice within a second: orch cancels the job in order (captures first)
and exits 130; the job is CANCELLED, every rank's report kept. In both, no process of the job
holds the terminal (a descriptor on it, or it as controlling terminal), and none is left once
the job ended.

The job's processes are found by what they carry, never by name: the spec's own marker in their
environment (launch.sh exports the spec's env to torchrun, the rank wrappers, nsys and the
ranks), the run directory in their command line (submitit's controller and orch's node
supervisor), or, on Slurm, the job's SLURM_JOB_ID (slurmstepd's tasks).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES, run_orch
from tests.terminal import Terminal

pytestmark = [pytest.mark.jobs, pytest.mark.nsys]

MARK = "ORCH_TEST_INTERRUPT"
COLS = 200  # every message on one screen line
# Rank 1 sleeps 100 ms in every step: the job runs for minutes unless stopped.
STEPS = ["--steps", "3000", "--slow-rank", "1", "--slow-ms", "100"]
# What a terminal signals to its foreground process group: ignored by submitit's controller.
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU)


class Job:
    """One job's spec, marker and run directory, and its processes by /proc."""

    def __init__(self, tmp: Path, cluster: str, nproc: int) -> None:
        self.tmp = tmp
        self.runs = tmp / "runs"
        self.mark = uuid.uuid4().hex
        self.cluster = cluster
        self.nranks = nproc * (2 if cluster == "local-slurm" else 1)
        spec = {
            "name": "ctrlc", "cluster": cluster, "run_root": str(self.runs),
            "launch": {"script": str(EXAMPLES / "train.py"), "nproc_per_node": nproc, "args": STEPS,
                       "env": {"GLOO_SOCKET_IFNAME": "lo", MARK: self.mark}},
            "layout": {"tp": 1, "pp": 1},
            "profile": {"ranks": "all", "trace": ["nvtx", "osrt"], "sample": "none", "cpuctxsw": "none"},
        }
        self.spec = tmp / "job.yaml"
        self.spec.write_text(yaml.safe_dump(spec))
        self.id: str | None = None

    def ref(self, env: dict[str, str]) -> str:
        """How orch's messages name the job to `orch status`/`orch cancel`: its id where the
        default run root holds it, else its run directory."""
        return str(self.id) if env.get("ORCH_RUNS") == str(self.runs) else str(self.run)

    @property
    def run(self) -> Path:
        (run,) = list(self.runs.iterdir())
        return run

    def processes(self) -> dict[int, list[str]]:
        """pid -> argv of every live process of the job."""
        marks = [f"{MARK}={self.mark}".encode()]
        if self.cluster == "local-slurm" and self.id:
            marks.append(f"SLURM_JOB_ID={self.id}".encode())
        run = str(self.run) if self.runs.is_dir() and any(self.runs.iterdir()) else None
        out = {}
        for d in Path("/proc").iterdir():
            if not d.name.isdigit() or int(d.name) == os.getpid():
                continue
            try:
                env = (d / "environ").read_bytes().split(b"\0")
                argv = (d / "cmdline").read_bytes().decode(errors="replace").split("\0")
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if state != "Z" and (any(m in env for m in marks) or (run and any(run in a for a in argv))):
                out[int(d.name)] = argv
        return out

    def ranks(self) -> list[int]:
        """The ranks' own processes (the Python running train.py, not its wrapper or nsys)."""
        return [pid for pid, argv in self.processes().items()
                if Path(argv[0]).name.startswith("python") and argv[1:3] == ["-u", str(EXAMPLES / "train.py")]]

    def left(self, settle_s: float = 30) -> dict[int, list[str]]:
        """The job's processes still alive after up to `settle_s` (the controller, slurmstepd end
        just after the job)."""
        deadline = time.monotonic() + settle_s
        while (left := self.processes()) and time.monotonic() < deadline:
            time.sleep(0.5)
        return left

    def status(self, env: dict[str, str]) -> dict:
        p = run_orch("status", str(self.id), "--runs", str(self.runs), "--json", env=env, timeout=120)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    def reports(self) -> list[int]:
        """The ranks with a written report."""
        return sorted(int(re.search(r"_r(\d+)_", p.name).group(1)) for p in (self.run / "reports").glob("*.nsys-rep")
                      if p.stat().st_size > 0)

    def clean_up(self, env: dict[str, str]) -> None:
        """After a failed test: stop what is left of the job (its own processes only)."""
        if self.id and self.processes():
            run_orch("cancel", str(self.id), "--runs", str(self.runs), env=env, timeout=180)
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _tty(pid: int) -> tuple[str, str]:
    """The pty's slave path and its device number as /proc/PID/stat gives it (tty_nr), read from
    orch while it runs in it."""
    return os.readlink(f"/proc/{pid}/fd/0"), Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[4]


def _ignored(pid: int) -> set[int]:
    mask = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith("SigIgn:"))
    bits = int(mask.split()[1], 16)
    return {s for s in range(1, 65) if bits >> (s - 1) & 1}


def _off_the_terminal(job: Job, tty: tuple[str, str]) -> None:
    """No process of the job has the terminal open, nor as its controlling terminal. submitit's
    controller, started by orch, stays in orch's session (so the terminal stays its controlling
    one) but holds no descriptor on it and ignores every signal the terminal sends."""
    slave, tty_nr = tty
    procs = job.processes()
    assert procs, "the job has no process"
    for pid, argv in procs.items():
        with contextlib.suppress(FileNotFoundError):
            fds = {os.readlink(f) for f in Path(f"/proc/{pid}/fd").iterdir()}
            assert slave not in fds, (pid, argv)
            controller = "submitit.local._local" in argv
            nr = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[4]
            if controller:
                assert set(TERMINAL_SIGNALS) <= _ignored(pid), (pid, argv)
            else:
                assert nr != tty_nr, (pid, argv)


def _every_rank_up(job: Job, still_s: float = 120, most_s: float = 600) -> None:
    """Until every rank's process runs. A busy machine starts nsys and the ranks slowly: the
    wait goes on while the job's processes still change, and ends after `still_s` of no change
    (a rank that died, a launcher that stopped) or `most_s` in all, showing the job's logs."""
    start = last = time.monotonic()
    seen = set(job.processes())
    while len(job.ranks()) < job.nranks:
        now = time.monotonic()
        procs = set(job.processes())
        if procs != seen:
            seen, last = procs, now
        if now - last > still_s or now - start > most_s:
            logs = {str(p.relative_to(job.runs)): p.read_text(errors="replace")[-1500:]
                    for p in sorted(job.runs.rglob("*")) if p.suffix in (".out", ".err", ".log") and p.is_file()}
            raise AssertionError(f"{len(job.ranks())} of {job.nranks} ranks running after {now - start:.0f} s "
                                 f"(no change for {now - last:.0f} s): {job.processes()}\nlogs: {logs}")
        time.sleep(0.2)


def _submit(job: Job, t: Terminal) -> tuple[str, str]:
    """Until every rank of the job `orch submit --wait` runs in `t` has run a few seconds."""
    tty = _tty(t.proc.pid)
    t.expect("as job ", timeout=120)
    t.expect(" RUNNING (", timeout=180)
    job.id = re.search(r"as job (\S+)", t.text).group(1)
    _every_rank_up(job)
    time.sleep(4)  # a few steps
    _off_the_terminal(job, tty)  # also while orch follows it
    return tty


@contextlib.contextmanager
def _terminal(job: Job, env: dict[str, str]) -> Iterator[Terminal]:
    """`orch submit --wait` in a terminal; on a failure, the job is stopped, then orch."""
    t = Terminal([sys.executable, "-m", "orchestrator.cli", "submit", str(job.spec), "--wait"], cols=COLS,
                 env=env, cwd=job.tmp)
    try:
        yield t
    finally:
        job.clean_up(env)
        if t.proc.poll() is None:
            t.kill()


def _once(job: Job, env: dict[str, str]) -> None:
    with _terminal(job, env) as t:
        tty = _submit(job, t)
        t.type(b"\x03")
        rc = t.wait(timeout=60)
        screen = " ".join(t.screen().split())  # the lines as written (a long path wraps)
        assert rc == 130, screen
        ref = job.ref(env)
        assert f"orch: job {job.id} goes on; a second Ctrl-C within 1 s cancels it (captures kept)" in screen, screen
        assert (f"orch: stopped following job {job.id}, left RUNNING; orch status {ref} follows it, "
                f"orch cancel {ref} stops it") in screen, screen
        assert "interrupted; nothing half-written" not in screen, screen
        _off_the_terminal(job, tty)
        # The job goes on: RUNNING whenever its ranks were seen alive after the status; then
        # `orch cancel` ends it in order.
        states = []
        while len(states) < 3:
            states.append(job.status(env)["state"])
            assert job.ranks() and states[-1] == "RUNNING", (states, job.processes())
            time.sleep(1)
        c = run_orch("cancel", str(job.id), "--runs", str(job.runs), env=env, timeout=180)
        assert c.returncode == 0 and f"job {job.id} cancelled" in c.stdout, c.stdout + c.stderr
        assert job.left() == {}
        assert job.status(env)["state"] == "CANCELLED"
        assert job.reports() == list(range(job.nranks))


def _twice(job: Job, env: dict[str, str]) -> None:
    with _terminal(job, env) as t:
        _submit(job, t)
        t.type(b"\x03")
        time.sleep(0.3)
        t.type(b"\x03")
        rc = t.wait(timeout=240)
        screen = " ".join(t.screen().split())  # the lines as written (a long path wraps)
        assert rc == 130, screen
        assert f"orch: job {job.id} goes on; a second Ctrl-C within 1 s cancels it (captures kept)" in screen, screen
        assert f"orch: cancelling job {job.id}: its captures are stopped first, then its processes" in screen, screen
        assert f"job {job.id} cancelled: captures stopped, then its processes" in screen, screen
        assert re.search(rf"job {job.id} \(ctrlc, \w+\): CANCELLED", screen), screen
        # A cancel, whichever signal carried it (on Slurm the early warning's SIGUSR2): never a time limit.
        assert "stopped by orch on a cancel" in screen and "time limit" not in screen, screen
        assert "stopped following" not in screen and "interrupted" not in screen, screen
        assert job.left() == {}
        assert job.status(env)["state"] == "CANCELLED"
        assert job.reports() == list(range(job.nranks))


def test_ctrl_c_once_leaves_the_local_job_running(tmp_path: Path, nsys: str) -> None:
    """With $ORCH_RUNS set to the spec's run root, the job is named by its id."""
    _once(Job(tmp_path, "local", nproc=2), {"ORCH_RUNS": str(tmp_path / "runs")})


def test_ctrl_c_twice_cancels_the_local_job(tmp_path: Path, nsys: str) -> None:
    _twice(Job(tmp_path, "local", nproc=2), {})


def test_ctrl_c_during_the_cancel_says_where_the_job_stands(tmp_path: Path, nsys: str) -> None:
    """A third Ctrl-C, while the cancel waits for the captures to stop, ends only that waiting:
    orch says the job is still stopping and that `orch cancel` waits for the rest; the stop goes on
    without orch and ends with every report kept."""
    job = Job(tmp_path, "local", nproc=2)
    env = {"ORCH_RUNS": str(job.runs)}
    with _terminal(job, env) as t:
        _submit(job, t)
        t.type(b"\x03")
        time.sleep(0.3)
        t.type(b"\x03")
        t.expect(f"orch: cancelling job {job.id}", timeout=30)
        time.sleep(1)  # the cancel has signalled the job; its captures are stopping
        t.type(b"\x03")
        rc = t.wait(timeout=60)
        screen = " ".join(t.screen().split())  # the lines as written (a long path wraps)
        assert rc == 130, screen
        assert (f"orch: stopped waiting for the cancel of job {job.id}, still RUNNING while its captures stop; "
                f"orch cancel {job.id} waits for the stop to end") in screen, screen
        assert "cancelled: captures stopped" not in screen and "interrupted" not in screen, screen
        c = run_orch("cancel", str(job.id), env=env, cwd=tmp_path, timeout=180)
        assert c.returncode == 0 and f"job {job.id} cancelled" in c.stdout, c.stdout + c.stderr
        assert job.left() == {}
        assert job.status(env)["state"] == "CANCELLED"
        assert job.reports() == list(range(job.nranks))


@pytest.mark.slurm
def test_ctrl_c_once_leaves_the_slurm_job_running(tmp_path: Path, nsys: str, slurm_cluster) -> None:
    """Without $ORCH_RUNS the job id is not found from here: the job is named by its run directory."""
    _once(Job(tmp_path, "local-slurm", nproc=1), slurm_cluster.client_env)


@pytest.mark.slurm
def test_ctrl_c_twice_cancels_the_slurm_job(tmp_path: Path, nsys: str, slurm_cluster) -> None:
    _twice(Job(tmp_path, "local-slurm", nproc=1), slurm_cluster.client_env)
