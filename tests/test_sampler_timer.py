"""The Python sampler's timer (templates/orch_loop_marks.py.j2, _ThreadTimer): it counts the main
thread's own CPU time and its SIGPROF reaches the main thread only. A process-wide timer
(setitimer's ITIMER_PROF) would tick for the other threads' CPU too, and its signal would land on
whichever thread runs (a gloo, NCCL or loader thread) when it fires."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import threading
import time
from pathlib import Path

import jinja2
import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.fast


def _hook(tmp: Path):
    """The rank hook's module, rendered as a job renders it."""
    text = jinja2.Template((REPO / "templates" / "orch_loop_marks.py.j2").read_text()).render(
        job={"spec": {"name": "t"}}, version="t", loop_marks=True, python_sampling_ms=10)
    path = tmp / "orch_loop_marks.py"
    path.write_text(text)
    loader = importlib.machinery.SourceFileLoader("orch_loop_marks_t", str(path))
    mod = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(mod)
    return mod


def _burn(seconds: float) -> None:
    """`seconds` of this thread's own CPU time."""
    t = time.thread_time()
    while time.thread_time() - t < seconds:
        sum(range(1000))


def test_samples_count_the_main_threads_cpu_and_reach_only_it(tmp_path: Path) -> None:
    pytest.importorskip("nvtx")
    mod = _hook(tmp_path)
    got = {"main": 0, "other": 0}

    def count(signum, frame) -> None:
        got["main" if threading.current_thread() is threading.main_thread() else "other"] += 1

    s = mod._Sampler(10)
    s.sample = count
    s.start()
    try:
        # The main thread asleep while two threads each burn 0.5 s: a process-wide CPU timer
        # ticks ~100 times here; the main thread's own clock does not move.
        workers = [threading.Thread(target=_burn, args=(0.5,)) for _ in range(2)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        asleep = dict(got)
        # ~10 ticks of the main thread's own CPU. The kernel checks a CPU timer at the scheduler's
        # tick while its thread runs: on a busy machine the thread runs in slices between ticks and
        # expiries merge into one signal (overruns), so it burns until 10 came, up to 3 s of CPU.
        t = time.thread_time()
        while got["main"] < 10 and time.thread_time() - t < 3:
            _burn(0.05)
        spent = time.thread_time() - t
    finally:
        s.stop()
    assert asleep == {"main": 0, "other": 0}, asleep
    # Never more often than every 10 ms of the main thread's CPU.
    assert got["other"] == 0 and 10 <= got["main"] <= spent / 0.010 * 1.5 + 2, (got, spent)
    n = got["main"]
    _burn(0.1)
    assert got["main"] == n  # stopped: the timer is gone
