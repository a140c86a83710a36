"""An independent, deliberately plain re-implementation of the report's metrics: Python
loops over rows read with sqlite3 straight from one rank's export. Tests compare orch's SQL
against this, never against numbers copied from orch's own output."""

from __future__ import annotations

import itertools
import re
import sqlite3
from pathlib import Path

STEP = re.compile(r"^(?:[Ss]tep|[Ii]teration)[ _#:]*(\d+)$")


def _merge(iv: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for s, e in sorted(iv):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _length(iv: list[tuple[int, int]]) -> int:
    return sum(e - s for s, e in iv)


def _intersect(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> int:
    total, i, j = 0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


class Rank:
    """One rank's export, with everything needed for the metrics, in its own time base."""

    def __init__(self, path: Path) -> None:
        con = sqlite3.connect(path)
        strings = dict(con.execute("SELECT id, value FROM StringIds"))
        self.session_start = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
        self.steps = []  # (tid, start, end, n)
        self.ranges = []  # default-domain non-step ranges: (start, end, text)
        for s, e, tid, text, text_id, dom in con.execute(
            "SELECT start, end, globalTid, text, textId, domainId FROM NVTX_EVENTS "
            "WHERE eventType IN (59, 60) AND end IS NOT NULL"
        ):
            t = text if text is not None else strings.get(text_id)
            if (dom or 0) != 0 or t is None:
                continue
            m = STEP.match(t)
            if m:
                self.steps.append((tid, s, e, int(m.group(1))))
            else:
                self.ranges.append((s, e, t))
        api = {}
        for s, tid, corr in con.execute("SELECT start, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME"):
            api[corr] = (s, tid)
        self.ops = []  # (start, end, kind, name, step)
        names = {}
        for s, e, corr, short in con.execute(
            "SELECT start, end, correlationId, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL"
        ):
            names[short] = strings[short]
            self.ops.append((s, e, "comm" if strings[short].startswith("nccl") else "compute",
                             strings[short], self._step(api.get(corr))))
        for table in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
            for s, e, corr in con.execute(f"SELECT start, end, correlationId FROM {table}"):
                self.ops.append((s, e, "memory", table, self._step(api.get(corr))))
        con.close()

    def _step(self, launch: tuple[int, int] | None) -> int | None:
        if launch is None:
            return None
        s, _tid = launch  # any launching thread: backward kernels come from the autograd thread
        hits = [n for _t, a, b, n in self.steps if a <= s < b]
        return max(hits) if hits else None

    def window(self) -> tuple[int, int]:
        first = min(n for *_, n in self.steps)
        sel = [(s, e) for s, e, _, _, st in self.ops if st is not None and st > first]
        return min(s for s, _ in sel), max(e for _, e in sel)

    def metrics(self, gap_ns: int = 1_000_000) -> dict:
        w0, w1 = self.window()

        def union(kinds: set[str]) -> list[tuple[int, int]]:
            return _merge([(max(s, w0), min(e, w1)) for s, e, k, _, _ in self.ops if k in kinds and e > w0 and s < w1])

        compute, comm, busy = union({"compute"}), union({"comm"}), union({"compute", "comm", "memory"})
        gaps = [(a[1], b[0]) for a, b in itertools.pairwise(busy) if b[0] - a[1] >= gap_ns]
        return {
            "window_ms": (w1 - w0) / 1e6, "compute_ms": _length(compute) / 1e6, "comm_ms": _length(comm) / 1e6,
            "overlap_ms": _intersect(comm, compute) / 1e6, "busy_ms": _length(busy) / 1e6,
            "gpu_idle_pct": 100 * (1 - _length(busy) / (w1 - w0)), "gaps": gaps,
        }

    def gap_ms_in(self, pattern: str, gaps: list[tuple[int, int]]) -> float:
        """Gap time whose innermost covering range (>= half the gap) matches `pattern`."""
        total = 0
        for gs, ge in gaps:
            cands = [(e - s, t) for s, e, t in self.ranges if 2 * (min(e, ge) - max(s, gs)) >= ge - gs]
            if cands and re.search(pattern, min(cands)[1]):
                total += ge - gs
        return total / 1e6

    def comm_starts(self, first_step_excluded: bool = True) -> dict[str, list[int]]:
        """Absolute (UTC ns) start times of each NCCL kernel name, in order."""
        out: dict[str, list[int]] = {}
        for s, _e, k, name, _st in sorted(self.ops):
            if k == "comm":
                out.setdefault(name, []).append(s + self.session_start)
        return out


def export_rank(path: Path) -> int:
    """The rank an export's file name carries (`<job>_<id>_r<N>_<host>.<pid>.sqlite`)."""
    return int(path.name.split("_r")[1].split("_")[0])


def per_rank(run: Path, sql: str, params: tuple = ()) -> dict[int, list[tuple]]:
    """Per rank, the rows of `sql` (with `params`) over its export in `run`/exports."""
    out = {}
    for f in sorted((run / "exports").glob("*.sqlite")):
        con = sqlite3.connect(f)
        try:
            out[export_rank(f)] = con.execute(sql, params).fetchall()
        finally:
            con.close()
    return out


def kernel_launches(run: Path, like: str) -> dict[int, list[tuple[int]]]:
    """Per rank, the start of the CUDA call that launched each kernel whose short name is LIKE
    `like`, over its export in `run`/exports."""
    return per_rank(run, "SELECT r.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                    "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId "
                    "JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE ?", (like,))


def last_steps(run: Path, prefix: str, suffix: str = "") -> dict[int, int]:
    """Per rank, the number N of its last NVTX range named `<prefix>N<suffix>` (the workload's
    steps), over its export in `run`/exports."""
    sql = """
        SELECT max(CAST(substr(t, ?, length(t) - ?) AS INTEGER)) FROM (
            SELECT coalesce(e.text, s.value) AS t FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId)
        WHERE t LIKE ?"""
    rows = per_rank(run, sql, (len(prefix) + 1, len(prefix) + len(suffix), f"{prefix}%{suffix}"))
    return {rank: r[0][0] for rank, r in rows.items()}


def kernel_count(path: Path) -> int:
    """Kernels in one export (0 where nsys wrote no kernel table: none reached it)."""
    con = sqlite3.connect(path)
    try:
        have = con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_KERNEL'").fetchone()[0]
        return con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0] if have else 0
    finally:
        con.close()


def gpu_memory_levels(path: Path) -> tuple[int, list[tuple[int, int]]]:
    """(device, [(time, bytes in use after it)]) of one rank's export (memory_levels)."""
    con = sqlite3.connect(path)
    try:
        return memory_levels(con)
    finally:
        con.close()


def memory_levels(con: sqlite3.Connection) -> tuple[int, list[tuple[int, int]]]:
    """(device, [(time, bytes in use after it)]) of one rank from its CUDA_GPU_MEMORY_USAGE_EVENTS:
    the device its device/array allocations put the most bytes on; there, device, array and
    static allocations (memKind 2, 3, 5) minus frees (operation 0 alloc, 1 free), summed per
    timestamp in time order, raised so that the level never goes below zero."""
    by_dev: dict[int, int] = {}
    for dev, b in con.execute("SELECT deviceId, bytes FROM CUDA_GPU_MEMORY_USAGE_EVENTS "
                              "WHERE memKind IN (2, 3) AND memoryOperationType = 0"):
        by_dev[dev] = by_dev.get(dev, 0) + b
    dev = max(by_dev, key=lambda d: (by_dev[d], -d))
    per: dict[int, int] = {}
    for t, op, b in con.execute("SELECT start, memoryOperationType, bytes FROM CUDA_GPU_MEMORY_USAGE_EVENTS "
                                "WHERE deviceId = ? AND memKind IN (2, 3, 5)", (dev,)):
        per[t] = per.get(t, 0) + (b if op == 0 else -b if op == 1 else 0)
    times = sorted(per)
    levels = list(itertools.accumulate(per[t] for t in times))
    base = max(0, -min(levels))
    return dev, [(t, level + base) for t, level in zip(times, levels, strict=True)]


def gpu_memory_peak(path: Path) -> tuple[int, int]:
    """(device, highest bytes in use) of one rank (gpu_memory_levels)."""
    dev, levels = gpu_memory_levels(path)
    return dev, max(level for _, level in levels)


def range_start(con: sqlite3.Connection, name: str) -> int:
    """The start of the (first) NVTX range named `name` in an export."""
    return con.execute("SELECT n.start FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId "
                       "WHERE coalesce(n.text, s.value) = ?", (name,)).fetchone()[0]


GPU_OP_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


def gpu_ops(con: sqlite3.Connection, where: str = "", params: tuple = ()) -> list[tuple[int, int]]:
    """(start, end) of every GPU op (kernels, copies, memsets) of an export, `where` (with its
    `params`) applied to each table, sorted."""
    return sorted(con.execute(" UNION ALL ".join(f"SELECT start, \"end\" FROM {t} {where}" for t in GPU_OP_TABLES),
                              params * len(GPU_OP_TABLES)))


def gpu_gaps(ops: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The idle gaps (start, end) between the union of sorted `ops`, in order."""
    out, busy_until = [], ops[0][1]
    for s, e in ops[1:]:
        if s > busy_until:
            out.append((busy_until, s))
        busy_until = max(busy_until, e)
    return out


def small_gaps_ms(export: Path, first: str, until: str) -> float:
    """ms the GPU sat idle for under 1 ms between two of its ops (kernels, copies, memsets) that
    start from the start of the NVTX range named `first` to that of the range named `until`."""
    con = sqlite3.connect(export)
    try:
        ops = gpu_ops(con, "WHERE start >= ? AND start < ?", (range_start(con, first), range_start(con, until)))
    finally:
        con.close()
    return sum(e - s for s, e in gpu_gaps(ops) if e - s < 1_000_000) / 1e6


def long_gaps_ms(export: Path, first: str, until: str, min_ns: int = 1_000_000) -> float:
    """ms the GPU sat idle in gaps of `min_ns` or more between its ops (kernels, copies,
    memsets) that begin from the start of the NVTX range named `first` to that of `until`."""
    con = sqlite3.connect(export)
    try:
        a, b = range_start(con, first), range_start(con, until)
        ops = gpu_ops(con)
    finally:
        con.close()
    return sum(e - s for s, e in gpu_gaps(ops) if e - s >= min_ns and a <= s < b) / 1e6
