"""GPU memory of a job that failed or was stopped: the step it ended in is cut from the steps
(docs/failing_jobs.md), but not from the memory. A rank that ran out of memory did so in that
step, in one allocation: its peak and the outcome's "held ... at its highest" count every
allocation up to the failure, and the outcome quotes torch's own message (what the failing
allocation asked for, what the process held) beside the events.

Real failing NCCL jobs on H200s (tests/fixtures/faults, README there), collected and reported as
a user would. The truth is plain sqlite3 over each rank's export, table
CUDA_GPU_MEMORY_USAGE_EVENTS (columns start, deviceId, memKind, memoryOperationType, bytes), and
the job's own log."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from tests import independent
from tests.conftest import REPO
from tests.stores import Stores

pytestmark = pytest.mark.replay

FAULTS = REPO / "tests" / "fixtures" / "faults"
GIB = 2**30


def memory_levels(export: Path) -> list[tuple[int, int]]:
    """(time, bytes in use after it) on the rank's own GPU (independent.gpu_memory_levels)."""
    return independent.gpu_memory_levels(export)[1]


def step_start(export: Path, n: int) -> int:
    con = sqlite3.connect(export)
    try:
        return independent.range_start(con, f"Step {n} Start")
    finally:
        con.close()


@pytest.fixture(scope="module")
def runs(stores: Stores) -> dict[str, tuple[Path, dict]]:
    """The failed and the stopped runs, collected and reported (`orch report --json`): the
    session's shared copies (tests/stores.py)."""
    return {name: stores.report(f"faults-{name}")[:2] for name in ("oom", "oom-1gpu", "timeout")}


@pytest.mark.parametrize("name", ["oom", "oom-1gpu", "timeout"])
def test_each_ranks_peak_counts_every_allocation_up_to_its_end(runs, name: str) -> None:
    """Each rank's peak (memory.ranks[].peak_bytes: the window's, from the steps after each
    rank's first) runs through the step the job ended in: the highest level in use from the
    start of the rank's `Step 1 Start` range (what it held then included) to the end of its
    capture."""
    run, rep = runs[name]
    mem = {r["rank"]: r for r in rep["memory"]["ranks"]}
    for f in sorted((run / "exports").glob("*.sqlite")):
        rank = independent.export_rank(f)
        t0 = step_start(f, 1)
        levels = memory_levels(f)
        held = [level for t, level in levels if t <= t0][-1:]  # in use when the window began
        truth = max(held + [level for t, level in levels if t > t0])
        assert mem[rank]["peak_bytes"] == truth, (name, rank, mem[rank]["peak_bytes"] / GIB, truth / GIB)
        assert mem[rank]["headroom_bytes"] == mem[rank]["capacity_bytes"] - truth


def _torch_said(run: Path) -> dict[str, str]:
    """What torch's message in the job's log says the failing allocation asked for and what the
    process and PyTorch held (its own words, read with a regex here)."""
    log = "".join(p.read_text(errors="replace") for p in (run / "submitit").glob("*_log.err"))
    (msg,) = set(re.findall(r"^\[rank0\]: torch\.OutOfMemoryError: (CUDA out of memory\..*)$", log, re.M))
    return {"asked": re.search(r"Tried to allocate (\S+ \S+)\.", msg)[1],
            "process": re.search(r"this process has (\S+ \S+) memory in use", msg)[1],
            "pytorch": re.search(r"(\S+ \S+) is allocated by PyTorch", msg)[1]}


def _raised_at(run: Path) -> tuple[str, int]:
    """The innermost frame of the workload's own file in rank 0's traceback (the job's log)."""
    log = "".join(p.read_text(errors="replace") for p in (run / "submitit").glob("*_log.err"))
    tb = log[log.index("[rank0]: Traceback (most recent call last):"):]
    tb = tb[: tb.index("torch.OutOfMemoryError")]
    file, line = re.findall(r'File "([^"]*ddp_faults\.py)", line (\d+), in main', tb)[-1]
    return file, int(line)


@pytest.mark.parametrize(("name", "step"), [("oom", 12), ("oom-1gpu", 8)])
def test_the_rank_that_ran_out_held_its_highest_in_the_step_it_failed_and_torch_says_what_it_asked(
        runs, name: str, step: int) -> None:
    """Rank 0 gets a 64x batch and fails in one allocation: on 2x H200 in step 12 (before, its
    peak was that of the finished steps, 4.11 GiB, the window cut before step 12), on one H200
    in step 8. Its highest level is in that step, and the failing allocation itself is in no
    event: torch's message says it."""
    run, rep = runs[name]
    exports = {independent.export_rank(f): f for f in (run / "exports").glob("*.sqlite")}
    levels = memory_levels(exports[0])
    top_t, top = max(levels, key=lambda x: (x[1], -x[0]))
    assert step_start(exports[0], step) <= top_t  # the highest level is in the step it failed in
    assert top > 100 * GIB
    mem = {r["rank"]: r for r in rep["memory"]["ranks"]}
    assert mem[0]["peak_bytes"] == top and rep["memory"]["peak_rank"] == 0
    o = rep["outcome"]
    assert f"rank 0 held {top / GIB:.2f} GiB of its GPU's 139.8 GiB at its highest, in step {step}" in o["line"]
    said = _torch_said(run)
    assert (f"torch: the failing allocation asked for {said['asked']} while the process held {said['process']} "
            f"({said['pytorch']} allocated by PyTorch, ") in o["line"], o["line"]
    assert o["torch_oom"].startswith("CUDA out of memory. Tried to allocate " + said["asked"])
    # The line to fix: where rank 0's program asked for it (its traceback's own frame).
    file, line = _raised_at(run)
    assert o["root_frame"] == f"{file}:{line} (main)" and o["root_from"] == "traceback"
    top_f = rep["findings"][0]
    assert top_f["fix"].startswith("Rank 0 ran out of GPU memory")
    assert f"It asked for the allocation that failed at {file}:{line} (main)." in top_f["fix"]
    near = [f for f in rep["findings"] if f["kind"] == "memory_near_capacity"]
    assert [f["ranks"] for f in near] == [[0]]  # its peak, now counted: 95.8 % (2 GPUs), 99.2 % (1) of the GPU
