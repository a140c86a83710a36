"""`orch status`'s one line per failed task, read from what the real torchrun printed when a
rank failed: the first rank to fail, how, and its own last error line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.submit.failure import exit_words, failure_line, rank_traceback
from tests.conftest import run_orch
from tests.test_e2e import _spec

RANKS = """
import os, signal, time
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    if os.environ.get("HOW", "raise") == "raise":
        raise ValueError("batch 7 has no labels")
    os.kill(os.getpid(), signal.SIGKILL)
time.sleep(60)
"""


def _torchrun(tmp_path: Path, how: str) -> str:
    prog = tmp_path / "ranks.py"
    prog.write_text(RANKS)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        str(prog)], capture_output=True, text=True, timeout=120,
                       env={"HOW": how, "GLOO_SOCKET_IFNAME": "lo", "PATH": "/usr/bin:/bin"})
    assert p.returncode != 0
    return p.stderr


@pytest.mark.parametrize(("how", "want"), [
    ("raise", "rank 1 failed first (exit status 1): ValueError: batch 7 has no labels"),
    ("kill", "rank 1 failed first (killed by SIGKILL (out of memory? the OOM killer sends it))"),
])
def test_names_the_rank_that_failed_first(tmp_path: Path, how: str, want: str) -> None:
    text = _torchrun(tmp_path, how)
    assert text.splitlines()[-1].startswith("=====")  # what the task table used to show
    assert failure_line(text) == want, text[-3000:]


def test_the_failing_ranks_own_traceback(tmp_path: Path) -> None:
    text = _torchrun(tmp_path, "raise")
    tb = rank_traceback(text).splitlines()
    assert tb[0] == "Traceback (most recent call last):" and tb[-1] == "ValueError: batch 7 has no labels", tb
    assert any("raise ValueError" in ln for ln in tb) and not any("torch/distributed/run.py" in ln for ln in tb)
    assert rank_traceback(_torchrun(tmp_path, "kill")) is None  # a killed rank printed nothing


def test_status_of_a_local_job_shows_the_failing_ranks_traceback(tmp_path: Path) -> None:
    """`orch submit --wait` of a job whose rank 1 raises (local executor, real torchrun)."""
    (tmp_path / "ranks.py").write_text(RANKS)
    spec = _spec(tmp_path, cluster="local", nproc=2, ranks="none", args=[], script=str(tmp_path / "ranks.py"))
    p = run_orch("submit", str(spec), "--wait", "--timeout", "300", cwd=tmp_path)
    assert p.returncode == 1 and "FAILED" in p.stdout, p.stdout + p.stderr
    assert "rank 1 failed first (exit status 1): ValueError: batch 7 has no labels" in " ".join(p.stdout.split())
    assert "the failing rank's traceback" in p.stdout and 'raise ValueError("batch 7 has no labels")' in p.stdout


@pytest.mark.parametrize(("code", "words"), [
    (137, "killed by SIGKILL (exit status 137; out of memory? the OOM killer sends it)"),
    (-9, "killed by SIGKILL (out of memory? the OOM killer sends it)"),
    (143, "killed by SIGTERM (exit status 143; stopped: time limit, cancel or another rank)"),
    (129, "killed by SIGHUP (exit status 129)"), (1, "exit status 1"), (255, "exit status 255"),
])
def test_exit_status_in_words(code: int, words: str) -> None:
    # The shell's 128 + N: signal.h numbers (SIGKILL 9, SIGTERM 15, SIGHUP 1).
    assert exit_words(code) == words


def test_other_nodes_say_they_were_stopped() -> None:
    # What a healthy node's torchrun ends with when srun stops it (seen on the local Slurm).
    text = ("W1123 08:01:29.179000 26304 site-packages/torch/distributed/elastic/agent/server/api.py:753] "
            "Received 15 death signal, shutting down workers\nTraceback (most recent call last):\n"
            '  File "/x/torch/distributed/run.py", line 1032, in <module>\n    main()\n'
            "torch.distributed.elastic.multiprocessing.api.SignalException: Process 26304 got signal: 15\n")
    assert failure_line(text).startswith("stopped by SIGTERM: another node's rank failed")
    assert failure_line("Traceback (most recent call last):\nKeyError: 'x'\n") is None
