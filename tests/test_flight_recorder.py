"""PyTorch's Flight Recorder on a hang: the rendered rank hook dumps every rank's recorder (and
stacks) on SIGWINCH while the rank is stuck inside a collective, and orch names the rank that
never entered the collective the others wait in. A real gloo job (torchrun, 2 processes) with
the hook orch renders; the expected sequence numbers are read back with plain pickle, the way
PyTorch writes them, not through orch's reader. (PyTorch's own `fr_trace` tool cannot read gloo
dumps in torch 2.13: it looks process groups up by a name gloo leaves empty.)"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.analyze import flight
from orchestrator.render.render import render
from orchestrator.spec.load import load_job
from orchestrator.submit import evidence
from tests.conftest import EXAMPLES

pytestmark = pytest.mark.jobs

HANG = """
import time, torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4, 8)
for step in range(6):
    if rank == 1 and step == 4:
        print("stuck", flush=True)
        time.sleep(600)
    dist.all_reduce(t)
print("finished", rank, flush=True)
"""


def _hook(tmp: Path) -> Path:
    """The pyhooks folder orch renders for a job."""
    r = render(load_job(EXAMPLES / "local-cpu.yaml"), tmp / "scripts", report_dir=tmp / "reports")
    d = tmp / "pyhooks"
    d.mkdir()
    for name, text in r.hooks.items():
        (d / name).write_text(text)
    return d


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(x) for x in out.split()]


@pytest.fixture(scope="module")
def hung_dumps(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Dumps of a real 2-rank gloo job in which rank 1 never enters its 5th all-reduce."""
    tmp = tmp_path_factory.mktemp("fr")
    (tmp / "hang.py").write_text(HANG)
    dumps = tmp / "dumps"
    env = {**os.environ, "PYTHONPATH": str(_hook(tmp)), "ORCH_DUMP_DIR": str(dumps), "TORCH_FR_BUFFER_SIZE": "2000"}
    out = tmp / "torchrun.out"
    with open(out, "w") as fh:
        run = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                                str(tmp / "hang.py")], cwd=tmp, env=env, stdout=fh, stderr=subprocess.STDOUT,
                               start_new_session=True)
    try:
        # Until rank 1 says it is stuck before its 5th all-reduce, however slowly a busy machine
        # starts the job; rank 0 has then finished the 4th and waits in the 5th.
        deadline = time.monotonic() + 600
        while "stuck" not in out.read_text() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "stuck" in out.read_text(), out.read_text()[-3000:]
        time.sleep(2)
        ranks = _children(run.pid)
        assert len(ranks) == 2, (ranks, out.read_text()[-3000:])
        for pid in ranks:
            os.kill(pid, signal.SIGWINCH)
        deadline = time.monotonic() + 120  # (a poll: a quiet machine dumps in about a second)
        want = [dumps / "flight_recorder" / f"rank_{r}" for r in (0, 1)] + [dumps / f"stacks.r{r}.txt" for r in (0, 1)]
        while time.monotonic() < deadline and not all(p.is_file() and p.stat().st_size for p in want):
            time.sleep(0.5)
    finally:
        for pid in [*_children(run.pid), run.pid]:  # torchrun starts each rank in a session of its own
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        run.wait(timeout=30)
    return dumps


def test_hook_dumps_recorder_and_stacks_of_ranks_stuck_in_a_collective(hung_dumps: Path) -> None:
    stacks = {r: (hung_dumps / f"stacks.r{r}.txt").read_text() for r in (0, 1)}
    assert "in all_reduce" in stacks[0] and "hang.py" in stacks[0], stacks[0]
    assert "hang.py" in stacks[1] and "all_reduce" not in stacks[1], stacks[1]
    got = evidence.stacks(hung_dumps)
    assert got[0][0].startswith("all_reduce (distributed/distributed_c10d.py:") and got[0][-1].startswith(
        "<module> (") and got[1][0].startswith("<module> ("), got
    seqs = {}
    for r in (0, 1):
        with open(hung_dumps / "flight_recorder" / f"rank_{r}", "rb") as fh:
            seqs[r] = max(e["collective_seq_id"] for e in pickle.load(fh)["entries"])
    assert seqs == {0: 5, 1: 4}


def test_the_rank_that_never_entered_is_named(hung_dumps: Path) -> None:
    last = evidence.last_collectives(hung_dumps / "flight_recorder")
    assert [(x.rank, x.seq, x.op) for x in last] == [(0, 5, "gloo:all_reduce"), (1, 4, "gloo:all_reduce")]
    behind, where, lines = flight.mismatch(last)
    assert behind == [1] and where == "collective #5 (gloo:all_reduce) of default_pg"
    assert len(lines) == 1 and lines[0].startswith(
        "Flight Recorder, default_pg: rank(s) 1 never entered collective #5 (gloo:all_reduce [[4, 8]]), "
        "which rank(s) 0 entered at "), lines
    line = HANG.splitlines().index("    dist.all_reduce(t)") + 1
    assert lines[0].count(f"hang.py:{line} (<module>)") == 2, lines[0]


def test_a_collective_that_differs_across_ranks(tmp_path: Path) -> None:
    """Same sequence number, different operation or sizes: the mismatch that never completes."""
    folder = tmp_path / "flight_recorder"
    folder.mkdir()
    for rank, sizes in ((0, [[4, 8]]), (1, [[4, 9]])):
        entry = {"collective_seq_id": 7, "process_group": ("0", "default_pg"), "profiling_name": "nccl:all_reduce",
                 "input_sizes": sizes, "is_p2p": False, "frames": [{"filename": "/w/train.py", "line": 3, "name": "f"}]}
        (folder / f"rank_{rank}").write_bytes(pickle.dumps({"version": "2.10", "entries": [entry]}))
    behind, _, lines = flight.mismatch(evidence.last_collectives(folder))
    assert behind == [] and lines == ["Flight Recorder, default_pg: collective #7 differs across ranks (a mismatch "
                                      "that never completes): rank 0: nccl:all_reduce [[4, 8]]; rank 1: "
                                      "nccl:all_reduce [[4, 9]]"]


def test_the_rank_that_called_a_collective_the_others_did_not_is_named(tmp_path: Path) -> None:
    """The NCCL pattern (nothing raises: the sizes differ, the job hangs until the watchdog): rank 1
    averages its loss for a log line at the point where rank 0's DDP issues its gradient
    all-reduce from the autograd thread, with no Python stack. Where both came from the
    program's own code, nothing tells which is odd."""
    folder = tmp_path / "flight_recorder"
    folder.mkdir()
    ddp = {"collective_seq_id": 12, "process_group": ("0", "default_pg"), "profiling_name": "nccl:all_reduce",
           "input_sizes": [[6637568]], "is_p2p": False, "frames": [], "thread_name": "pt_autograd_0"}
    log = {**ddp, "input_sizes": [[1]], "thread_name": "MainThread",
           "frames": [{"filename": "/w/train.py", "line": 120, "name": "main"}]}
    for rank, entry in ((0, ddp), (1, log)):
        (folder / f"rank_{rank}").write_bytes(pickle.dumps({"version": "2.10", "entries": [entry]}))
    last = evidence.last_collectives(folder)
    assert flight.odd_ones(last) == [1]
    assert flight.mismatch(last)[0] == []  # nobody is behind: both entered #12
    for rank, entry in ((0, {**log, "input_sizes": [[2]]}), (1, log)):
        (folder / f"rank_{rank}").write_bytes(pickle.dumps({"version": "2.10", "entries": [entry]}))
    assert flight.odd_ones(evidence.last_collectives(folder)) == []


class _Boom:
    def __reduce__(self):
        return (os.system, ("touch /tmp/orch-fr-pwned",))


def test_a_dump_that_would_run_code_is_skipped(tmp_path: Path) -> None:
    folder = tmp_path / "flight_recorder"
    folder.mkdir()
    marker = Path("/tmp/orch-fr-pwned")
    marker.unlink(missing_ok=True)
    (folder / "rank_0").write_bytes(pickle.dumps({"entries": [_Boom()]}))
    (folder / "rank_1").write_bytes(b"\x80\x04not a pickle")
    assert evidence.last_collectives(folder) == []
    assert not marker.exists()


CHILDREN = """
import faulthandler, multiprocessing as mp, os, sys, torch, torch.distributed as dist

def spawned(q):
    q.put((faulthandler.is_enabled(), sys.excepthook is sys.__excepthook__))

if __name__ == "__main__":
    dist.init_process_group("gloo", init_method="file://" + os.path.abspath("store"), rank=0, world_size=1)
    t = torch.ones(4)
    dist.all_reduce(t)
    pid = os.fork()  # a DataLoader worker: its resource sharer's thread calls sys.excepthook when the rank dies
    if pid == 0:
        try:
            raise ConnectionResetError("the rank died under its worker")
        except ConnectionResetError:
            sys.excepthook(*sys.exc_info())
        os._exit(0)
    os.waitpid(pid, 0)
    fr = os.path.join(os.environ["ORCH_DUMP_DIR"], "flight_recorder", "rank_0")
    stacks = os.path.join(os.environ["ORCH_DUMP_DIR"], "stacks.r0.txt")
    print("after the forked child:", os.path.exists(fr), os.path.getsize(stacks), flush=True)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=spawned, args=(q,))
    p.start()
    print("spawned child hooked:", q.get(timeout=60), flush=True)
    p.join()
    dist.all_reduce(t)
    print("the rank's group still works:", t.tolist(), flush=True)
    raise RuntimeError("the rank itself fails")
"""


def test_only_the_rank_itself_leaves_evidence(tmp_path: Path) -> None:
    """A process the rank forks (a DataLoader worker) inherits the hook and torch.distributed as it
    was at the fork; when the rank dies under it, multiprocessing's resource sharer calls
    sys.excepthook in it. That child must dump no Flight Recorder (a stale copy, which names the
    rank's last collective before the fork) and no stack under the rank's name, nor end the
    rank's groups; a child multiprocessing spawns sets none of the hook up; the rank's own
    failure still leaves both (docs/failing_jobs.md). A real one-rank gloo program with the hook
    orch renders."""
    (tmp_path / "prog.py").write_text(CHILDREN)
    dumps = tmp_path / "dumps"
    env = {**os.environ, "PYTHONPATH": str(_hook(tmp_path)), "ORCH_DUMP_DIR": str(dumps), "RANK": "0"}
    env.pop("PYTHONFAULTHANDLER", None)
    p = subprocess.run([sys.executable, "prog.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert p.returncode == 1 and "RuntimeError: the rank itself fails" in p.stderr, p.stdout + p.stderr
    assert "after the forked child: False 0" in p.stdout, p.stdout + p.stderr
    assert "spawned child hooked: (False, True)" in p.stdout, p.stdout
    assert "the rank's group still works: [1.0, 1.0, 1.0, 1.0]" in p.stdout, p.stdout
    with open(dumps / "flight_recorder" / "rank_0", "rb") as fh:
        assert max(e["collective_seq_id"] for e in pickle.load(fh)["entries"]) == 2
    stacks = (dumps / "stacks.r0.txt").read_text()
    assert stacks.count("Current thread") == 1, stacks  # the rank's one dump, on its way out
