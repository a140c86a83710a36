"""A job the time limit's early warning ends, as Slurm ends it. Slurm's process tracking signals
every process of the step at once, and may send the warning up to a minute early: the warning can
end the launch command before the node supervisor's loop takes the signal, or kill a task before
its supervisor starts. Either way `orch status` says TIMEOUT, not FAILED. The supervisor is a
real process here (submit/node.py) and its launch command a real child."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.fast

# The launch command: it sends its supervisor the warning (as Slurm's signal to the whole step
# would) and ends on it at once, as a rank killed by SIGUSR2 does (128 + 12).
CHILD = "import os, signal; os.kill(os.getppid(), signal.SIGUSR2); os._exit(140)"

SUPERVISE = """
import sys
from submitit.core.utils import FailedJobError
from orchestrator.limits import StopTiming
from orchestrator.submit.node import NodeCommand
cmd = NodeCommand([sys.executable, "-c", sys.argv[2]], cwd=sys.argv[1], folder=sys.argv[1],
                  timing=StopTiming(limit_s=600, lead_s=30, grace_s=5), enforce_limit=False)
try:
    cmd()
except FailedJobError:
    sys.exit(1)
"""


def test_a_warning_that_ends_the_launch_command_first_is_still_a_timeout(tmp_path: Path) -> None:
    env = {**os.environ, "SLURM_JOB_ID": "41", "SLURM_NODEID": "0", "PYTHONPATH": str(REPO)}
    p = subprocess.run([sys.executable, "-c", SUPERVISE, str(tmp_path), CHILD], env=env, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 1, p.stderr  # the job failed, as Slurm records it
    stop = json.loads((tmp_path / "41_0_stop.json").read_text())
    assert stop["reason"] == "timeout" and stop["signal"] == "SIGUSR2", stop
    assert "this job is timed-out" in p.stderr, p.stderr


def test_a_task_the_warning_killed_before_its_supervisor_is_a_timeout(tmp_path: Path, monkeypatch) -> None:
    """The warning can come while the tasks start, before a supervisor takes SIGUSR2: srun
    says the task ended on the signal, and no stop file exists. (No Slurm command on PATH: the
    job is one Slurm forgot, judged by submitit's results.)"""
    from orchestrator.submit.slurm import SlurmBackend

    monkeypatch.setenv("PATH", str(tmp_path / "nobin"))
    err = tmp_path / "41_0_log.err"
    err.write_text("srun: error: node1: task 0: User defined signal 2\n"
                   "srun: launch/slurm: _step_signal: Terminating StepId=41.0\n")
    tasks = [{"task": 0, "result": "failure", "stderr": str(err)}]
    assert SlurmBackend().state(tmp_path, "41", tasks)["state"] == "TIMEOUT"
    err.write_text("srun: error: node1: task 0: Exited with exit code 3\n")
    assert SlurmBackend().state(tmp_path, "41", tasks)["state"] == "FAILED"
