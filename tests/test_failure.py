"""`orch status`'s one line per failed task, read from what the real torchrun printed when a
rank failed: the first rank to fail, how, and its own last error line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.analyze.outcome import first_failure
from orchestrator.store.evidence import TaskEnd
from orchestrator.submit.failure import exit_words, failed_at, failure_line, rank_traceback, root_cause
from tests.conftest import run_orch
from tests.test_e2e import _spec

pytestmark = pytest.mark.jobs
FIXTURES = Path(__file__).parent / "fixtures" / "failure"

RANKS = """
import os, signal, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
how = os.environ.get("HOW", "raise")
if dist.get_rank() == 1:
    if how in ("kill", "kill_victim"):
        time.sleep(0.5 if how == "kill_victim" else 0)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5 if how == "victim" else 0)
    raise ValueError("batch 7 has no labels")
if how in ("victim", "kill_victim"):
    dist.all_reduce(torch.ones(4))  # waits for rank 1, which raises instead of coming
time.sleep(60)
"""


def _torchrun(tmp_path: Path, how: str, *launch: str, env: dict[str, str] | None = None) -> str:
    prog = tmp_path / "ranks.py"
    prog.write_text(RANKS)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                        *launch, str(prog)],
                       capture_output=True, text=True, timeout=120,
                       env={"HOW": how, "GLOO_SOCKET_IFNAME": "lo", "PATH": "/usr/bin:/bin", **(env or {})})
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


def test_a_retried_nsys_start_is_not_how_the_rank_ended() -> None:
    """A real task log (tests/fixtures/failure/README.md): nsys failed to start rank 1 once and the
    wrapper started it again ("... starting it again"); the program then raised in step 3. The
    rank ended on its own error, which the line gives, not on the wrapper's note."""
    text = (FIXTURES / "nsys-retry-then-raise.err").read_text()
    assert "orch: rank 1: nsys exited with status 1 before the program started (attempt 1 of 3)" in text
    assert failure_line(text) == "rank 1 failed first (exit status 1): RuntimeError: planted failure at step 3"
    assert root_cause(text) == (1, "exit status 1", False)
    # Nor is its note on a start that hung and was killed, before that retry.
    hung = text.replace("orch: rank 1: nsys exited with status 1 before",
                        "orch: rank 1: nsys started no program in 120 s (ORCH_NSYS_START_S): killing it\n"
                        "orch: rank 1: nsys exited with status 1 before")
    assert failure_line(hung) == failure_line(text), hung
    # Where nsys never started, the wrapper's last message is how the rank ended.
    gave_up = text + ("orch: rank 1: nsys exited with status 1 before the program started, 3 time(s); its own "
                      "messages are above\n")
    assert failure_line(gave_up) == ("rank 1 failed first (exit status 1): nsys exited with status 1 before the "
                                     "program started, 3 time(s); its own messages are above")


def test_a_native_abort_is_the_aborted_ranks_whichever_rank_torchrun_names() -> None:
    """A real task log (tests/fixtures/failure/README.md): rank 0 aborted on gloo's size check,
    rank 1 lost its peer and ended first, so torchrun named rank 1. The abort's message names no
    rank; it is rank 0's, the one rank that ended by SIGABRT, and is not cut short by the note."""
    text = (FIXTURES / "abort-after-peer-failed.err").read_text()
    assert failure_line(text) == (
        "rank 0 failed first (killed by SIGABRT (exit status 134; aborted: a failed check in native code)): "
        "gloo::EnforceNotMet: op.preamble.length <= op.nbytes. 590912 vs 4. Received data size doesn't match "
        "expected size. Is there a distributed collective mismatch in your code? "
        "(torchrun names rank 1, which lost its peer)")
    assert root_cause(text) == (0, "killed by SIGABRT (exit status 134; aborted: a failed check in native code)",
                                False)
    # Had both ranks aborted, the message could be either's: rank 0 is still first (rank 1's own
    # traceback says it lost its peer), without words it cannot be sure are its own.
    both = text.replace("exitcode  : 1 (pid: 6545)", "exitcode  : 134 (pid: 6545)")
    assert failure_line(both) == ("rank 0 failed first (killed by SIGABRT (exit status 134; aborted: a failed check "
                                  "in native code)) (torchrun names rank 1, which lost its peer)")


def test_the_failing_ranks_own_traceback(tmp_path: Path) -> None:
    text = _torchrun(tmp_path, "raise")
    tb = rank_traceback(text).splitlines()
    assert tb[0] == "Traceback (most recent call last):" and tb[-1] == "ValueError: batch 7 has no labels", tb
    assert any("raise ValueError" in ln for ln in tb) and not any("torch/distributed/run.py" in ln for ln in tb)
    killed = _torchrun(tmp_path, "kill")
    assert rank_traceback(killed) is None  # a killed rank printed nothing
    # A busy machine's run once held an untagged traceback too (another process's: a connection
    # to the killed rank broke while it still set up): a rank killed by SIGKILL printed nothing,
    # so it is not the killed rank's, nor its last words.
    mixed = "\n".join(tb) + "\n" + killed  # the raising run's traceback, its rank tags gone
    assert rank_traceback(mixed) is None
    assert failure_line(mixed) == failure_line(killed) == (
        "rank 1 failed first (killed by SIGKILL (out of memory? the OOM killer sends it))")


def test_a_rank_that_lost_its_peer_is_not_the_first_failure(tmp_path: Path) -> None:
    """Rank 0 waits in an all-reduce for rank 1, which raises; rank 0 then fails with gloo's
    "Connection closed by peer". When torchrun sees both failed at one poll it stamps them the
    same second and names rank 0, the lower rank, as its root cause. A wrapper holds each rank's
    process until both programs ended (as nsys holds it until its report is written), so that
    torchrun's poll (every 2 s) finds both failed: left to chance, rank 0's exit came after a
    poll on a loaded CI machine, and torchrun named rank 1 itself."""
    sync = tmp_path / "sync"
    sync.mkdir()
    wrap = tmp_path / "exit_together.sh"
    wrap.write_text('#!/bin/bash\n"$@"; rc=$?\ntouch "$SYNC/done.$RANK"\n'
                    'while [ ! -e "$SYNC/done.0" ] || [ ! -e "$SYNC/done.1" ]; do sleep 0.01; done\nexit $rc\n')
    wrap.chmod(0o755)
    text = _torchrun(tmp_path, "victim", "--monitor-interval=2", "--no-python", str(wrap), sys.executable,
                     env={"SYNC": str(sync)})
    root = text[text.index("Root Cause (first observed failure)"):]
    assert "rank      : 0 (local_rank: 0)" in root and "Connection closed by peer" in text, text[-3000:]
    assert failure_line(text) == ("rank 1 failed first (exit status 1): ValueError: batch 7 has no labels "
                                  "(torchrun names rank 0, which lost its peer)")
    assert root_cause(text) == (1, "exit status 1", False)
    assert rank_traceback(text).splitlines()[-1] == "ValueError: batch 7 has no labels"


# Wrappers that hold rank 1's process 5 s after its program ended, as nsys holds it until its
# report is written: one that torchrun's SIGTERM ends (-15), one that traps it, as orch's does,
# and still ends with its program's status.
_SLOW_EXIT = '#!/bin/bash\n"$@"; rc=$?\nif [ "$RANK" = 1 ]; then sleep 5; fi\nexit $rc\n'
_SLOW_EXIT_TRAPPED = ('#!/bin/bash\ntrap "stopped=1" TERM\n"$@"; rc=$?\n'
                      'if [ "$RANK" = 1 ]; then for _ in $(seq 50); do sleep 0.1; done; fi\nexit $rc\n')


@pytest.mark.parametrize(("how", "wrapper", "code", "line", "root"), [
    ("victim", _SLOW_EXIT, "-15", "rank 1 failed first: ValueError: batch 7 has no labels", (1, "", False)),
    ("kill_victim", _SLOW_EXIT_TRAPPED, "137",
     "rank 1 failed first (killed by SIGKILL (exit status 137; out of memory? the OOM killer sends it))",
     (1, "killed by SIGKILL (exit status 137; out of memory? the OOM killer sends it)", False)),
], ids=["raised", "sigkilled"])
def test_a_rank_torchrun_stopped_can_be_the_first_failure(tmp_path: Path, how: str, wrapper: str, code: str,
                                                          line: str, root: tuple) -> None:
    """Rank 1's program raises (or is SIGKILLed) while rank 0 waits for it in an all-reduce; the
    wrapper keeps rank 1's process after its program ended, so torchrun sees rank 0 (which lost
    its peer) fail first and stops rank 1 with SIGTERM. Rank 1's own traceback, or the status
    its wrapper ended with, says it failed first."""
    wrap = tmp_path / "slow_exit.sh"
    wrap.write_text(wrapper)
    wrap.chmod(0o755)
    text = _torchrun(tmp_path, how, "--no-python", str(wrap), sys.executable)
    failures = text[text.index("Failures:"):]
    assert f"rank      : 1 (local_rank: 1)\n  exitcode  : {code}" in failures, text[-3000:]
    assert "rank      : 0 (local_rank: 0)" in failures[failures.index("Root Cause"):], text[-3000:]
    assert failure_line(text) == f"{line} (torchrun names rank 0, which lost its peer)"
    assert root_cause(text) == root
    if how == "victim":
        assert rank_traceback(text).splitlines()[-1] == "ValueError: batch 7 has no labels"


def _node(tmp_path: Path, node: int, port: int) -> subprocess.Popen[str]:
    d = tmp_path / f"node{node}"
    d.mkdir()
    (d / "ranks.py").write_text(RANKS)
    return subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes=2", f"--node-rank={node}",
                             "--nproc-per-node=1", "--rdzv-backend=static", "--master-addr=127.0.0.1",
                             f"--master-port={port}", str(d / "ranks.py")], stderr=subprocess.PIPE, text=True,
                            env={"HOW": "victim", "GLOO_SOCKET_IFNAME": "lo", "PATH": "/usr/bin:/bin"})


def test_across_nodes_the_node_whose_rank_lost_its_peer_comes_second(tmp_path: Path) -> None:
    """Two torchruns ("nodes") of one rank each: rank 1's node raises, rank 0's node fails with
    the closed connection. Each names its own rank as root cause; with rank 0's node's clock
    ahead, its failure would sort first by time alone."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nodes = [_node(tmp_path, n, port) for n in (0, 1)]
    texts = [p.communicate(timeout=120)[1] for p in nodes]
    assert all(p.returncode != 0 for p in nodes)
    tasks = []
    for t, text in enumerate(texts):
        rank, how, lost = root_cause(text)
        tasks.append(TaskEnd(task=t, result="error", failed_rank=rank, failed_exit=how, failed_by_peer=lost,
                             failed_at=failed_at(text), error=failure_line(text) or ""))
    assert [(t.failed_rank, t.failed_by_peer) for t in tasks] == [(0, True), (1, False)], texts
    # The node whose rank only lost its peer comes second even when its clock says it failed first.
    tasks = [tasks[0].model_copy(update={"failed_at": "0101 00:00:00.000000"}),
             tasks[1].model_copy(update={"failed_at": "1231 23:59:59.999999"})]
    first = first_failure(tasks)
    assert first is not None and first.failed_rank == 1
    assert first.error == "rank 1 failed first (exit status 1): ValueError: batch 7 has no labels"
    alone = first_failure([tasks[0]])
    assert alone is not None and alone.failed_rank == 0  # alone, the victim is all there is to name


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


def test_status_says_why_orch_stopped_a_node() -> None:
    """A node whose Slurm step ended because another node failed: its stop record's reason is
    said in words (one space between them), as the time limit's and a cancel's are."""
    from orchestrator.cli.common import out
    from orchestrator.cli.submit import print_status

    st = {"job_id": "7", "name": "j", "executor": "slurm", "state": "FAILED", "source": "sacct", "tasks": [],
          "profiled_ranks": [], "reports": {},
          "stop": {"reason": "step_ended", "signal": "SIGTERM", "after_s": 14.8}}
    with out.capture() as cap:
        print_status(st)
    assert ("stopped by orch when Slurm ended the step (another node failed) (SIGTERM) after 14.8 s: captures first, "
            "then the ranks") in " ".join(cap.get().split())
    st["stop"]["reason"] = "something new"
    with out.capture() as cap:
        print_status(st)
    assert "stopped by orch (SIGTERM) after 14.8 s" in " ".join(cap.get().split())
