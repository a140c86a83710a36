"""`orch collect` stopped while it works: `--parts` while its pool maps, by SIGTERM to the collect
alone (`timeout`, a scheduler; Ctrl-C reaches the whole process group, this does not) or by
SIGKILL (the OOM killer); the in-process collect by SIGTERM while it exports real .nsys-rep
reports. No process it started outlives it: its map workers and their exports end within
seconds, the oracle being the kernel's session ids in /proc (every process the collect starts
stays in the session it leads), not orch's own bookkeeping. A later collect takes every rank."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import REPO, capture_cpu

EXPORTS = REPO / "tests" / "fixtures" / "pairs" / "pp4-uneven" / "exports"


def _session(sid: int) -> list[tuple[int, str]]:
    """Every live process of session `sid` but zombies: (pid, command line)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append((int(stat.parent.name), cmd.strip()[:200]))
    return out


def _until(cond, timeout_s: float, poll_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(poll_s)
    return cond()


def _children(pid: int) -> list[int]:
    """The processes the main thread of `pid` started: one read, fast enough to catch a window of
    a few tens of milliseconds (a scan of /proc takes longer)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _stop_while(argv: list[str], sig: signal.Signals, ready: Callable[[int], bool],
                settle_s: float, poll_s: float = 0.1) -> tuple[int, str]:
    """Run `argv` in a session of its own, send it `sig` once `ready` says so of its pid (asked
    every `poll_s`), and check that the session is empty within `settle_s` of its end: its exit
    status and stderr."""
    p = subprocess.Popen(argv, cwd=REPO, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        assert _until(lambda: ready(p.pid) or p.poll() is not None, 60, poll_s), _session(p.pid)
        assert p.poll() is None, "the collect ended before it could be stopped"
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        assert _until(lambda: not _session(p.pid), settle_s), _session(p.pid)
    finally:  # whatever a failed assertion left running
        for pid, _ in _session(p.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if p.poll() is None:
            p.kill()
    return p.returncode, err


@pytest.mark.replay
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stopped_collect_leaves_no_map_worker_behind(sig: signal.Signals, tmp_path: Path) -> None:
    src = tmp_path / "in"
    shutil.copytree(EXPORTS, src)
    argv = [sys.executable, "-m", "orchestrator.cli", "collect", "--from", str(src), "--out", str(tmp_path / "run"),
            "--parts", "--map-stats", "--workers", "2"]
    # the pool's two workers mapping
    # (a worker stops once the DuckDB statement it is in returns)
    code, err = _stop_while(argv, sig, lambda pid: sum("multiprocessing.spawn" in c for _, c in _session(pid)) >= 2, 20)
    if sig == signal.SIGTERM:
        assert code == 130 and "orch: interrupted; nothing half-written was kept" in err, (code, err)
    again = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "4 rank(s) ok" in again.stdout, again.stdout + again.stderr


@pytest.mark.jobs
@pytest.mark.nsys
@pytest.mark.parametrize("when", ["first-export", "mid-way"])
def test_a_collect_stopped_while_it_exports_leaves_no_export_behind(when: str, nsys: str, tmp_path: Path) -> None:
    """Six copies of a real capture of 150,000 OS calls (an export of about 2 s each), exported
    2 at a time by the in-process collect, stopped by SIGTERM once one is done and the next runs
    (mid-way), or as soon as its first export runs, while the command still loads its modules
    (the collect starts its first exports before it imports DuckDB and pydantic)."""
    capture_cpu(nsys, "import time\nfor _ in range(150_000):\n    time.sleep(0.000001)\n", tmp_path / "cap",
                trace="osrt")
    src = tmp_path / "in"
    src.mkdir()
    for i in range(6):
        shutil.copy(tmp_path / "cap.nsys-rep", src / f"cap_r{i}_h.nsys-rep")
    argv = [sys.executable, "-m", "orchestrator.cli", "collect", "--from", str(src), "--out", str(tmp_path / "run"),
            "--workers", "2", "--nsys", nsys]
    done = tmp_path / "run" / "exports"

    def ready(pid: int) -> bool:
        if when == "first-export":  # the early exports are the main thread's children
            return bool(_children(pid))
        return any(done.glob("cap_r*_h.sqlite")) and any(" export " in c for _, c in _session(pid))

    # (an export left to itself would end about 2 s later)
    code, err = _stop_while(argv, signal.SIGTERM, ready, 0.5, 0.01 if when == "first-export" else 0.1)
    assert code == 130 and "orch: interrupted; nothing half-written was kept" in err, (code, err)
    assert not list((tmp_path / "run").rglob(".*.tmp-*"))
    again = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "6 rank(s) ok" in again.stdout, again.stdout + again.stderr
