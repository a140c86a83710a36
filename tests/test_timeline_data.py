"""The timeline's data (analyze/timeline.py) on a real 2-GPU capture, against Python over the
store's own rows: the kernels drawn for a rank and the summary of the ranks not drawn."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.analyze.build import report_from_views
from orchestrator.analyze.timeline import _drawn_ops, _Frame, _hidden
from orchestrator.metrics.engine import Options, Views, analysis
from tests.stores import Stores

pytestmark = pytest.mark.fast

QUIET = Console(stderr=True, quiet=True)


@pytest.fixture(scope="module")
def analysed(stores: Stores, gpu_fixtures: Path):
    store = stores.store(gpu_fixtures / "ddp_straggler")
    con, v = analysis(store, Options())
    yield con, v, report_from_views(v, store, Options())
    con.close()


def _union_ns(intervals: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of the union of `intervals` clipped to [lo, hi], by a sweep in Python."""
    total, end = 0, lo
    for s, e in sorted((max(s, lo), min(e, hi)) for s, e in intervals if e > lo and s < hi):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def _a_step(v: Views, rank: int) -> tuple[int, int]:
    """A selected step's span on `rank` (its third step range)."""
    rows = v.query('SELECT start, "end" FROM steps WHERE rank = ? ORDER BY step', [rank])
    return rows[2]["start"], rows[2]["end"]


def test_ranks_not_drawn_are_summarised_by_their_compute_in_the_span(analysed) -> None:
    """busy_ms_median: the union of the rank's compute kernels (NCCL ones left out) inside the
    step's span and the rank's window, what the lanes drawn above it show as compute."""
    con, v, report = analysed
    t0, t1 = _a_step(v, 1)
    h = _hidden(v, report, [0], t0, t1)
    w0, w1 = con.execute("SELECT w0, w1 FROM win WHERE rank = 1").fetchone()
    kernels = con.execute("""SELECT start, "end" FROM kernels WHERE rank = 1
                             AND NOT starts_with(short_name, 'nccl')""").fetchall()
    want = _union_ns(kernels, max(t0, w0), min(t1, w1))
    assert want > 0 and h is not None and h.n == 1
    assert h.busy_ms_median == round(want / 1e6, 3)


def test_drawn_kernels_are_every_kernel_of_the_rank_in_the_frame(analysed) -> None:
    con, v, _ = analysed
    t0, t1 = _a_step(v, 0)
    frames = [_Frame("a", 0, {0: "root"}, t0, t1), _Frame("b", 0, {1: "victim"}, t0, t1)]
    ops = _drawn_ops(v, frames)
    for i, rank in ((0, 0), (1, 1)):
        want = con.execute("""SELECT count(*) FROM kernels WHERE rank = ? AND "end" > ? AND start < ?""",
                           [rank, t0, t1]).fetchone()[0]
        got = [o for o in ops[i] if o["kind"] == "kernel"]
        assert want > 0 and len(got) == want and {o["rank"] for o in ops[i]} == {rank}
