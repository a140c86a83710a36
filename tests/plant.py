"""Delay one rank's work in real nsys exports with plain sqlite3 UPDATEs, so the trace stays real
(tests/test_critical_path.py, scripts/bench_critical_path.py).

On the delayed rank, everything that starts at or after the start of one of its communication
kernels K (the first launched in each planted step) moves D later, the CPU ranges and calls open at that moment end
D later, and a new NVTX range of length D (LABEL) covers the pause on the step's thread: work
only that rank does (a checkpoint, an extra evaluation). On every other rank the kernel matching
K (the same index among kernels of that name: NCCL's order) now ends when the delayed rank's
does, and everything of that rank after its old end moves as much later: what the pause costs
it; its first CUDA call after that end blocks for as long (a CPU held back by its GPU waits in a
CUDA call: a sync, or a launch into a full queue). K is, where possible, one the peers already
waited for (they started first, both ended together), so the delayed rank's own kernel did not
wait and the shift is exact.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

GPU_TABLES = {"CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"}
LABEL = "checkpoint"  # the inserted range: what the delayed rank did


def _timed_tables(con: sqlite3.Connection) -> list[str]:
    names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    return [t for t in names
            if {"start", "end"} <= {c[1] for c in con.execute(f'PRAGMA table_info("{t}")')}]


def _shift(con: sqlite3.Connection, t: int, d: int) -> None:
    """Everything of this export that starts at or after t moves d later; CPU intervals open at
    t (ranges, calls) end d later (GPU work already running is not paused)."""
    for tbl in _timed_tables(con):
        if tbl not in GPU_TABLES:
            con.execute(f'UPDATE "{tbl}" SET "end" = "end" + ? WHERE start < ? AND "end" > ?', (d, t, t))
        con.execute(f'UPDATE "{tbl}" SET start = start + ?, "end" = "end" + ? WHERE start >= ?', (d, d, t))


def _origin(con: sqlite3.Connection) -> int:
    return con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]


def _kernels(con: sqlite3.Connection, like: str) -> list[tuple[int, int, int, int]]:
    """(start, end, rowid, launch) of the kernels whose short name matches `like`, in start order;
    launch = the start of the CUDA call that launched it (the GPU may run far behind the CPU)."""
    return con.execute("SELECT k.start, k.\"end\", k.rowid, coalesce(r.start, k.start) "
                       "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
                       "LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
                       "ON r.correlationId = k.correlationId WHERE s.value LIKE ? ORDER BY k.start",
                       (like,)).fetchall()


def _step_range(con: sqlite3.Connection, step: int) -> tuple[int, int, int]:
    return con.execute("SELECT n.start, n.\"end\", n.globalTid FROM NVTX_EVENTS n LEFT JOIN StringIds s "
                       "ON s.id = n.textId WHERE coalesce(n.text, s.value) = ?", (f"step {step}",)).fetchone()


def _waited_for(ks: dict[int, list[tuple[int, int, int, int]]], org: dict[int, int], first: int, peers: list[int],
                i: int) -> bool:
    """Every peer started its i-th kernel first and ended it with the delayed rank (aligned clocks)."""
    kr = ks[first][i]
    return all(ks[q][i][0] + org[q] < kr[0] + org[first] - 50_000
               and abs(ks[q][i][1] + org[q] - kr[1] - org[first]) < 200_000 for q in peers)


def _read(path: Path, like: str, step: int) -> tuple[int, list[tuple[int, int, int, int]], tuple[int, int, int]]:
    con = sqlite3.connect(path)
    try:
        return _origin(con), _kernels(con, like), _step_range(con, step)
    finally:
        con.close()


def plant(files: dict[int, Path], delayed: list[int], steps: list[int], d_ns: int, like: str) -> None:
    """Delay every rank of `delayed` by d_ns in each of `steps` (see the module docstring). One
    export open at a time (thousands of ranks)."""
    first = delayed[0]
    peers = [r for r in files if r != first]
    for step in steps:
        info = {r: _read(p, like, step) for r, p in files.items()}
        org = {r: x[0] for r, x in info.items()}
        ks = {r: x[1] for r, x in info.items()}
        s0 = info[first][2][0]
        n = min(len(k) for k in ks.values())
        cand = [i for i in range(n) if ks[first][i][3] >= s0]  # launched in the step
        # Prefer a kernel every peer already waited in (exact); with many ranks any will do
        # (the delayed rank's own wait there, at most the ranks' skew, is then counted twice).
        i = next((i for i in cand if len(delayed) == len(files) or _waited_for(ks, org, first, peers, i)), cand[0])
        for r, path in files.items():
            c, k = sqlite3.connect(path), ks[r][i]
            if r in delayed:
                _shift(c, k[0], d_ns)
                c.execute("INSERT INTO NVTX_EVENTS (start, \"end\", eventType, text, globalTid, domainId) "
                          "VALUES (?, ?, 59, ?, ?, 0)", (k[0], k[0] + d_ns, LABEL, info[r][2][2]))
            else:  # its matching kernel now ends when the delayed rank's does
                late = ks[first][i][1] + org[first] + d_ns - k[1] - org[r]
                c.execute('UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET "end" = "end" + ? WHERE rowid = ?', (late, k[2]))
                _shift(c, k[1], late)
                # Its CPU was held back only by waiting for its GPU, and a CPU waits for its GPU
                # inside a CUDA call (a sync, a launch into a full queue): the first call after the
                # old end blocks for the delay instead of starting later.
                c.execute('UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = start - ? WHERE rowid = '
                          '(SELECT rowid FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE start >= ? ORDER BY start LIMIT 1)',
                          (late, k[1] + late))
            c.commit()
            c.close()
