"""nsys itself failing in the middle of a job: its agent dies. nsys 2022.4 then prints
"Connection to the Agent lost." and exits with status 0 while the program it started runs on,
outside it. Real jobs through `orch submit` (local executor, gloo on CPU, real nsys) whose last
rank's nsys agent is stopped (SIGTERM) once that rank's program runs: the rank lasts as long as its
program (the wrapper waits for it and says why), a cancel reaches the program, and no process
outlives the job (tests/subreaper.py, checked by pid)."""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import JobTree
from tests.test_job_stops import _reports, _run_dir, _spec

pytestmark = [pytest.mark.jobs, pytest.mark.nsys]


def _agent_of(nsys_pid: int) -> int | None:
    """The pid of the agent nsys 2022.4 started for the `nsys profile` of pid `nsys_pid`."""
    name = re.compile(rb"(--session-name=)?profile-(.*-)?%d" % nsys_pid)
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--start-agent" in argv and any(name.fullmatch(a) for a in argv):
            return int(proc.name)
    return None


def _kill_agent(runs: Path, rank: int, after_s: float, found: dict, timeout_s: float = 120) -> None:
    """Once rank `rank`'s program runs (its pid file, written by the program's first act, is in the
    node's control folder), stops that rank's nsys agent `after_s` later. With SIGTERM: nsys 2022.4
    answers it as it answers a crashed agent, and a SIGKILLed agent can leave its session table
    locked for every later nsys of the machine (docs/failing_jobs.md)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for ctl in runs.glob("*/logs/.orch-*"):
            try:
                nsys_pid = int((ctl / f"nsys.r{rank}.pid").read_text())
                app = int((ctl / f"app.r{rank}.pid").read_text())
            except (OSError, ValueError):
                continue
            agent = _agent_of(nsys_pid)
            if agent is not None:
                time.sleep(after_s)
                os.kill(agent, signal.SIGTERM)
                found.update(agent=agent, app=app)
                return
        time.sleep(0.2)


def _start(tmp_path: Path, nproc: int) -> tuple[dict, threading.Thread, Path]:
    """The job's spec (rank 0 sleeps 100 ms a step, so every rank runs about 15 s) and the thread
    that kills the last rank's nsys agent 2 s after that rank's program started."""
    spec = _spec(tmp_path, ["--steps", "150", "--slow-rank", "0", "--slow-ms", "100"], "05:00", grace=5,
                 nproc=nproc)
    found: dict = {}
    killer = threading.Thread(target=_kill_agent, args=(tmp_path / "runs", nproc - 1, 2.0, found), daemon=True)
    killer.start()
    return found, killer, spec


def _logs(run: Path, kind: str) -> str:
    return "".join(f.read_text() for f in (run / "submitit").glob(f"*_log.{kind}"))


def _stopped_after_the_launch(err: str) -> str:
    """The node supervisor's lines naming what it stopped after the launch ended: nsys' agent may
    still be writing when the machine is busy, but the program must have ended with its rank."""
    return "\n".join(line for line in err.splitlines() if "node supervisor" in line and "still running after" in line)


def _left(rank: int, app: int) -> str:
    return f"orch: rank {rank}: nsys exited (status 0) while its program (pid {app}) ran on"


def test_a_rank_whose_nsys_lost_its_agent_lasts_as_long_as_its_program(tmp_path: Path, nsys: str,
                                                                      tree: JobTree) -> None:
    """One rank: had its wrapper ended with its nsys, torchrun would end the launch and the node
    supervisor would stop the training it no longer saw."""
    found, killer, spec = _start(tmp_path, nproc=1)
    p = tree.orch("submit", str(spec), "--wait", "--timeout", "200")
    killer.join(timeout=5)
    assert found, "rank 0's nsys agent was never found running"
    assert p.returncode == 0 and "COMPLETED" in p.stdout, p.stdout + p.stderr
    run = _run_dir(tmp_path)
    err, out = _logs(run, "err"), _logs(run, "out")
    assert "Connection to the Agent lost." in err and _left(0, found["app"]) in err, err
    # The program trained to its end as the job's rank, and ended before the launch did: the node
    # supervisor did not have to stop it.
    assert "rank 0 stage 0 done" in out, out
    assert f"pid {found['app']} (" not in _stopped_after_the_launch(err), err
    if not _reports(run):
        assert "rank 0: no report (its task's log says why)" in p.stdout, p.stdout
    assert tree.survivors() == []


def test_a_cancel_reaches_a_program_its_nsys_left(tmp_path: Path, nsys: str, tree: JobTree) -> None:
    """Without nsys, torchrun's stop does not reach the program (nsys started it in a session of its
    own): the wrapper passes it on, and the job stops at once, every process with it."""
    found, killer, spec = _start(tmp_path, nproc=2)
    p = tree.orch("submit", str(spec))
    assert p.returncode == 0, p.stderr
    job = re.search(r"as job (\S+)", p.stdout).group(1)
    killer.join(timeout=120)
    assert found, "rank 1's nsys agent was never found running"
    run = _run_dir(tmp_path)
    deadline = time.monotonic() + 60
    while _left(1, found["app"]) not in _logs(run, "err") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _left(1, found["app"]) in _logs(run, "err") and tree.survivors(settle_s=0)  # rank 1 runs unprofiled
    c = tree.orch("cancel", job, "--runs", str(tmp_path / "runs"))
    assert c.returncode == 0 and f"job {job} cancelled" in c.stdout, c.stdout + c.stderr
    err = _logs(run, "err")
    assert f"pid {found['app']} (" not in _stopped_after_the_launch(err), err
    assert "rank 1 stage 0 done" not in _logs(run, "out")  # stopped, not run to its end
    assert tree.survivors() == []
    assert 0 in _reports(run)
