"""The phase table's GPU projection (`phase_ops` in metrics/sql/92_phases.sql): which NVTX
ranges enclose each kernel's CUDA launch on the launching thread. orch numbers a thread's
launches by time and finds each range's first and last launch by two ASOF joins; checked here
against a brute-force plain-sqlite3 computation over the export (every range of the thread
that contains the launch), on a random timeline with nested push/pop ranges on two threads,
overlapping start/end ranges on one of them, and launches sharing a timestamp."""

from __future__ import annotations

import random
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from orchestrator.collect.collect import collect
from orchestrator.collect.identity import Layout
from orchestrator.metrics.engine import Options, analysis
from tests.synthetic import MS, TID, Export

pytestmark = pytest.mark.fast

OTHER_TID = TID + 1


def _nested(e: Export, rng: random.Random, s: int, end: int, depth: int, tid: int) -> None:
    """Non-overlapping child ranges inside [s, end), recursively (what push/pop produces)."""
    t = s
    while depth < 4 and t < end - 40_000:
        a = t + rng.randrange(0, 20_000)
        b = min(end, a + rng.randrange(10_000, max(10_001, (end - a) // 2)))
        if b <= a:
            break
        e.nvtx(a, b, rng.choice(["forward", "backward", "optimizer", "data"]), tid=tid)
        _nested(e, rng, a, b, depth + 1, tid)
        t = b + rng.randrange(0, 5_000)


def _build(path: Path, seed: int) -> None:
    rng = random.Random(seed)
    e = Export(path, 0)
    for i in range(6):
        t0 = i * 10 * MS
        e.nvtx(t0, t0 + 10 * MS, f"step {i}")
        for tid in (TID, OTHER_TID):
            _nested(e, rng, t0, t0 + 10 * MS, 1, tid)
        # start/end ranges (eventType 60) that overlap each other at one nesting level, and
        # a zero-length one
        for _ in range(3):
            a = t0 + rng.randrange(0, 8 * MS)
            e.nvtx(a, a + rng.randrange(MS, 3 * MS), "async_io", event_type=60)
        e.nvtx(t0 + 5 * MS, t0 + 5 * MS, "marker", event_type=60)
        for _ in range(40):
            launch = t0 + rng.randrange(0, 10 * MS)
            tid = rng.choice((TID, OTHER_TID))
            start = launch + rng.randrange(5_000, 50_000)
            e.kernel(launch, start, start + rng.randrange(1_000, 200_000), "gemm", tid=tid)
            if rng.random() < 0.2:  # another launch at the same instant (one number for both)
                e.kernel(launch, start + 300_000, start + 400_000, "gemm", tid=tid)
    # edges: a launch at a range's start is inside it, one at a range's end is not
    t0 = 61 * MS
    e.nvtx(t0, t0 + MS, "edge_open", tid=TID)
    e.nvtx(t0 - MS, t0, "edge_closed", tid=TID)
    e.kernel(t0, t0 + 10_000, t0 + 20_000, "gemm", tid=TID)
    e.close()


def _oracle(path: Path) -> Counter:
    """(group, kernel start, kernel end, tid, range start) for every range containing a launch."""
    con = sqlite3.connect(path)
    rows = con.execute("""
        SELECT n.text, k.start, k."end", r.globalTid, n.start
        FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
        JOIN NVTX_EVENTS n ON n.globalTid = r.globalTid AND n.start <= r.start AND r.start < n."end"
        WHERE n.text NOT LIKE 'step %'""").fetchall()
    con.close()
    return Counter(rows)


def test_phase_ops_match_brute_force(tmp_path: Path) -> None:
    d = tmp_path / "exports"
    d.mkdir()
    f = d / "phase_1_r0_h.100.sqlite"
    _build(f, seed=7)
    res = collect([d], tmp_path / "run", layout=Layout(), workers=1)
    con, v = analysis(res.store, Options(stats_scope="capture"))
    try:
        got = Counter((r["grp"], r["s"], r["e"], r["tid"], r["inst"]) for r in v.query(
            "SELECT g.grp, o.s, o.e, o.tid, o.inst FROM phase_ops o "
            "JOIN (SELECT DISTINCT gid, grp FROM phase_inst) g USING (gid) WHERE g.grp NOT LIKE 'step%'"))
        overlapping = v.scalar("""SELECT count(*) FROM (
            SELECT max("end") OVER (PARTITION BY rank, tid, domain_id, depth ORDER BY start, "end"
                                    ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) > start AS o
            FROM phase_inst WHERE "end" > start) WHERE o""")
        by_tid = v.query("SELECT tid, count(*) AS n FROM phase_ops GROUP BY tid ORDER BY tid")
    finally:
        con.close()
    want = _oracle(f)
    assert overlapping > 0, "the timeline must have overlapping ranges at one level"
    assert len(by_tid) == 2 and all(r["n"] > 0 for r in by_tid)
    assert sum(want.values()) > 200
    assert got == want
    assert any(k[0] == "edge_open" for k in got) and not any(k[0] == "edge_closed" for k in got)
