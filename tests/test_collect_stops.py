"""`orch collect --parts` stopped while its pool maps: by SIGTERM to the collect alone (`timeout`,
a scheduler; Ctrl-C reaches the whole process group, this does not) or by SIGKILL (the OOM
killer). No process it started outlives it: its map workers and their exports end within
seconds, the oracle being the kernel's session ids in /proc (every process the collect starts
stays in the session it leads), not orch's own bookkeeping. A later collect maps every rank."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.replay

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


def _until(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stopped_collect_leaves_no_map_worker_behind(sig: signal.Signals, tmp_path: Path) -> None:
    src = tmp_path / "in"
    shutil.copytree(EXPORTS, src)
    argv = [sys.executable, "-m", "orchestrator.cli", "collect", "--from", str(src), "--out", str(tmp_path / "run"),
            "--parts", "--map-stats", "--workers", "2"]
    p = subprocess.Popen(argv, cwd=REPO, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        # the pool's two workers (and multiprocessing's resource tracker) mapping
        assert _until(lambda: len(_session(p.pid)) >= 4 or p.poll() is not None, 60), _session(p.pid)
        assert p.poll() is None, "the collect ended before it could be stopped"
        p.send_signal(sig)
        _, err = p.communicate(timeout=60)
        assert _until(lambda: not _session(p.pid), 20), _session(p.pid)
    finally:  # whatever a failed assertion left running
        for pid, _ in _session(p.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if p.poll() is None:
            p.kill()
    if sig == signal.SIGTERM:
        assert p.returncode == 130 and "orch: interrupted; nothing half-written was kept" in err, (p.returncode, err)
    again = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "4 rank(s) ok" in again.stdout, again.stdout + again.stderr
