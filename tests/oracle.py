"""Independent ground truth over Nsight Systems SQLite exports: plain Python + sqlite3, no orch
imports, no DuckDB. Tests compare orch's analysis with what these functions compute.

Conventions
- Every function takes the path of ONE decompressed export (`.sqlite`; use `decompressed()` for
  a `.sqlite.gz`) unless its name says otherwise (`*_across` functions take {rank: path}).
- Times are integer ns on the absolute clock: TARGET_INFO_SESSION_START_TIME.utcEpochNs + the
  export's relative ns. Ranks profiled on one host share that clock (checked by
  `clock_residual_across`: matched NCCL kernels end nearly together).
- GPU work is kernels + memcpy + memset of the export (all devices it saw). "Compute" is every
  kernel whose short name does not start with `nccl`; NCCL kernels (collectives and send/recv)
  are communication.
- A kernel belongs to a step when the CUDA API call that launched it started inside the step's
  NVTX range, on ANY thread of the process (PyTorch launches backward kernels from its autograd
  thread, outside the main thread's ranges).
- CUDA API names are reported without their `_vNNNN` suffix.

`python tests/oracle.py DIR [-o truth.json]` computes tests/fixtures/real/truth.json from the
fixtures in DIR (the `<capture>_r<rank>_<host>.<pid>.sqlite.gz` files).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import functools
import gzip
import json
import os
import re
import shutil
import sqlite3
import statistics
import sys
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise

MS = 1e6

# CUDA runtime/driver calls that block the calling CPU thread until GPU work is done.
SYNC_API = {
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaThreadSynchronize",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize",
}
# Synchronous copies (the non-Async runtime/driver memcpy family).
SYNC_MEMCPY_RE = re.compile(r"^(cudaMemcpy(2D|3D|ToSymbol|FromSymbol)?|cuMemcpy(HtoD|DtoH|DtoD|2D|3D)?)$")
DEFAULT_STEP_RE = r"^(?:[Ss]tep|[Ii]teration) (\d+)(?: Start)?$"
MEMCPY_DTOH, MEMCPY_HTOD = 2, 1
MEM_PAGEABLE = 0


# ---------------------------------------------------------------- files


@contextlib.contextmanager
def decompressed(path: str) -> Iterator[str]:
    """Yield a path to a plain SQLite file: `path` itself, or a temporary copy of a `.gz`."""
    if not path.endswith(".gz"):
        yield path
        return
    fd, tmp = tempfile.mkstemp(suffix=".sqlite")
    try:
        with os.fdopen(fd, "wb") as out, gzip.open(path, "rb") as src:
            shutil.copyfileobj(src, out)
        yield tmp
    finally:
        os.unlink(tmp)
        _export.cache_clear()


# ---------------------------------------------------------------- rows


@dataclass(frozen=True, order=True)
class Kernel:
    start: int
    end: int
    device: int
    stream: int
    corr: int
    short: str
    name: str

    @property
    def nccl(self) -> bool:
        return self.short.startswith("nccl")


@dataclass(frozen=True, order=True)
class MemOp:
    start: int
    end: int
    device: int
    stream: int
    corr: int
    op: str  # "memcpy" | "memset"
    copy_kind: int  # ENUM_CUDA_MEMCPY_OPER (memcpy only; -1 for memset)
    src_kind: int
    dst_kind: int
    nbytes: int


@dataclass(frozen=True, order=True)
class Api:
    start: int
    end: int
    tid: int
    corr: int
    name: str


@dataclass(frozen=True, order=True)
class Range:
    start: int
    end: int
    tid: int
    domain: int
    text: str


@dataclass(frozen=True, order=True)
class OsCall:
    start: int
    end: int
    tid: int
    name: str


class _Export:
    def __init__(self, path: str) -> None:
        self.path = path
        self.con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        self.tables = {r[0] for r in self.con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        self.strings = dict(self.con.execute("SELECT id, value FROM StringIds")) if "StringIds" in self.tables else {}
        self.t0 = int(self.con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0])

    def rows(self, sql: str) -> list[tuple]:
        return self.con.execute(sql).fetchall()

    @functools.cached_property
    def kernels(self) -> list[Kernel]:
        if "CUPTI_ACTIVITY_KIND_KERNEL" not in self.tables:
            return []
        s, t0 = self.strings, self.t0
        return sorted(Kernel(a + t0, b + t0, d, st, c or 0, s.get(sh, "?"), s.get(dn, "?"))
                      for a, b, d, st, c, sh, dn in self.rows(
                          "SELECT start, end, deviceId, streamId, correlationId, shortName, demangledName "
                          "FROM CUPTI_ACTIVITY_KIND_KERNEL"))

    @functools.cached_property
    def memops(self) -> list[MemOp]:
        t0, out = self.t0, []
        if "CUPTI_ACTIVITY_KIND_MEMCPY" in self.tables:
            out += [MemOp(a + t0, b + t0, d, st, c or 0, "memcpy", k, sk if sk is not None else -1,
                          dk if dk is not None else -1, n)
                    for a, b, d, st, c, k, sk, dk, n in self.rows(
                        "SELECT start, end, deviceId, streamId, correlationId, copyKind, srcKind, dstKind, bytes "
                        "FROM CUPTI_ACTIVITY_KIND_MEMCPY")]
        if "CUPTI_ACTIVITY_KIND_MEMSET" in self.tables:
            out += [MemOp(a + t0, b + t0, d, st, c or 0, "memset", -1, -1, -1, n)
                    for a, b, d, st, c, n in self.rows(
                        "SELECT start, end, deviceId, streamId, correlationId, bytes FROM CUPTI_ACTIVITY_KIND_MEMSET")]
        return sorted(out, key=lambda m: (m.start, m.end))

    @functools.cached_property
    def api(self) -> list[Api]:
        if "CUPTI_ACTIVITY_KIND_RUNTIME" not in self.tables:
            return []
        s, t0 = self.strings, self.t0
        return sorted(Api(a + t0, b + t0, tid, c or 0, re.sub(r"_v\d+$", "", s.get(n, "?")))
                      for a, b, tid, c, n in self.rows(
                          "SELECT start, end, globalTid, correlationId, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME"))

    @functools.cached_property
    def nvtx(self) -> list[Range]:
        if "NVTX_EVENTS" not in self.tables:
            return []
        s, t0 = self.strings, self.t0
        out = []
        for a, b, tid, dom, text, text_id in self.rows(
                "SELECT start, end, globalTid, domainId, text, textId FROM NVTX_EVENTS "
                "WHERE eventType IN (59, 60) AND end IS NOT NULL"):
            out.append(Range(a + t0, b + t0, tid or 0, dom or 0, text if text is not None else s.get(text_id, "")))
        return sorted(out, key=lambda r: (r.start, -r.end))

    @functools.cached_property
    def osrt(self) -> list[OsCall]:
        if "OSRT_API" not in self.tables:
            return []
        s, t0 = self.strings, self.t0
        return sorted(OsCall(a + t0, b + t0, tid, s.get(n, "?"))
                      for a, b, tid, n in self.rows("SELECT start, end, globalTid, nameId FROM OSRT_API"))

    @functools.cached_property
    def api_by_corr(self) -> dict[int, Api]:
        return {a.corr: a for a in self.api if a.corr}

    @functools.cached_property
    def sync_type_by_corr(self) -> dict[int, str]:
        if "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION" not in self.tables:
            return {}
        names = dict(self.rows("SELECT id, label FROM ENUM_CUPTI_SYNC_TYPE")) \
            if "ENUM_CUPTI_SYNC_TYPE" in self.tables else {}
        return {c: names.get(t, str(t)) for c, t in self.rows(
            "SELECT correlationId, syncType FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")}

    @functools.cached_property
    def gpu_all(self) -> list[tuple[int, int]]:
        return merge([(k.start, k.end) for k in self.kernels] + [(m.start, m.end) for m in self.memops])

    @functools.cached_property
    def gpu_compute(self) -> list[tuple[int, int]]:
        return merge([(k.start, k.end) for k in self.kernels if not k.nccl])

    @functools.cached_property
    def gpu_nccl(self) -> list[tuple[int, int]]:
        return merge([(k.start, k.end) for k in self.kernels if k.nccl])


@functools.lru_cache(maxsize=64)
def _export(path: str) -> _Export:
    return _Export(path)


# ---------------------------------------------------------------- intervals


def merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Union of [start, end) intervals, sorted and disjoint."""
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def covered(merged: list[tuple[int, int]], t0: int, t1: int) -> int:
    """ns of [t0, t1) covered by a merged interval list."""
    i = max(bisect.bisect_right(merged, (t0, t0)) - 1, 0)
    total = 0
    while i < len(merged) and merged[i][0] < t1:
        a, b = merged[i]
        total += max(0, min(b, t1) - max(a, t0))
        i += 1
    return total


# ---------------------------------------------------------------- basic accessors


def session_start(path: str) -> int:
    """TARGET_INFO_SESSION_START_TIME.utcEpochNs of the export."""
    return _export(path).t0


def kernels(path: str) -> list[Kernel]:
    """Every kernel on the absolute clock, by start."""
    return _export(path).kernels


def nccl_kernels(path: str, regex: str = "") -> list[Kernel]:
    """NCCL kernels (short name starts with `nccl`) whose short name matches `regex`, by start."""
    rx = re.compile(regex)
    return [k for k in _export(path).kernels if k.nccl and rx.search(k.short)]


def memops(path: str) -> list[MemOp]:
    return _export(path).memops


def cuda_api(path: str) -> list[Api]:
    """CUDA runtime/driver API calls on the absolute clock, by start (names without `_vNNNN`)."""
    return _export(path).api


def nvtx_ranges(path: str, domain: int | None = 0) -> list[Range]:
    """Push/pop and start/end NVTX ranges (default domain only unless domain=None)."""
    return [r for r in _export(path).nvtx if domain is None or r.domain == domain]


def osrt_calls(path: str) -> list[OsCall]:
    return _export(path).osrt


def main_thread(path: str) -> int:
    """The globalTid of the main thread (tid == pid) of the process that launched the most
    kernels; globalTid packs pid in bits 24..47 and tid in bits 0..23."""
    e = _export(path)
    launches = Counter(e.api_by_corr[k.corr].tid for k in e.kernels if k.corr in e.api_by_corr)
    if not launches:
        return 0
    top = launches.most_common(1)[0][0]
    pid = (top >> 24) & 0xFFFFFF
    return (top & ~0xFFFFFF) | pid


def launch_time(path: str, k: Kernel | MemOp) -> int | None:
    a = _export(path).api_by_corr.get(k.corr)
    return a.start if a else None


# ---------------------------------------------------------------- steps


def nvtx_steps(path: str, regex: str = DEFAULT_STEP_RE) -> list[tuple[int, int, int]]:
    """(n, start, end) of every NVTX range whose text matches `regex` (group 1 = the number), in
    time order. Numbers may repeat (a loop that restarts at 0 every epoch)."""
    rx = re.compile(regex)
    out = []
    for r in nvtx_ranges(path):
        m = rx.match(r.text)
        if m:
            out.append((int(m.group(1)), r.start, r.end))
    return sorted(out, key=lambda x: x[1])


def step_gpu_work(path: str, steps: list[tuple[int, int, int]]) -> list[dict]:
    """Per step: the GPU work launched inside it (launch API start within the range, any thread):
    first start, last end, compute/nccl/all busy ns inside [first start, last end]."""
    e = _export(path)
    starts = [s for _, s, _ in steps]
    per: list[list] = [[] for _ in steps]
    for w in list(e.kernels) + list(e.memops):
        t = launch_time(path, w)
        if t is None:
            continue
        i = bisect.bisect_right(starts, t) - 1
        if i >= 0 and t <= steps[i][2]:
            per[i].append(w)
    out = []
    for (n, s, t), work in zip(steps, per, strict=True):
        if not work:
            out.append({"n": n, "cpu_start": s, "cpu_end": t, "items": 0})
            continue
        a, b = min(w.start for w in work), max(w.end for w in work)
        out.append({"n": n, "cpu_start": s, "cpu_end": t, "items": len(work), "gpu_start": a, "gpu_end": b,
                    "compute_ns": covered(merge([(w.start, w.end) for w in work
                                                 if isinstance(w, Kernel) and not w.nccl]), a, b),
                    "nccl_ns": covered(merge([(w.start, w.end) for w in work
                                              if isinstance(w, Kernel) and w.nccl]), a, b),
                    "busy_ns": covered(merge([(w.start, w.end) for w in work]), a, b)})
    return out


def iteration_starts(path: str, kernel_regex: str | None = None,
                     burst_gap_ns: int = 2_000_000) -> tuple[str, list[int]]:
    """Iteration boundaries without NVTX, from a kernel that runs in one burst per iteration.

    With `kernel_regex`, the kernels whose demangled name matches it; otherwise the kernel name
    whose bursts (occurrences closer than `burst_gap_ns` merged) are the most regular among
    names with >= 5 bursts. Returns (name or regex, burst start times)."""
    e = _export(path)
    by_name: dict[str, list[int]] = defaultdict(list)
    for k in e.kernels:
        if kernel_regex is None or re.search(kernel_regex, k.name):
            by_name[kernel_regex or k.name].append(k.start)

    def bursts(ts: list[int]) -> list[int]:
        out: list[int] = []
        prev = None
        for t in sorted(ts):
            if prev is None or t - prev > burst_gap_ns:
                out.append(t)
            prev = t
        return out

    best, best_cv, best_b = "", float("inf"), []
    for name, ts in by_name.items():
        b = bursts(ts)
        if len(b) < 5:
            continue
        d = [y - x for x, y in pairwise(b)]
        tail = d[1:] if len(d) > 3 else d  # the first period carries warm-up
        mean = statistics.fmean(tail)
        cv = statistics.pstdev(tail) / mean if mean > 0 else float("inf")
        # prefer regular AND frequent (more bursts) names
        score = cv - 0.001 * len(b)
        if score < best_cv:
            best, best_cv, best_b = name, score, b
    return best, best_b


def iteration_period_ms(starts: list[int], skip: int = 1) -> float:
    """Median period between consecutive iteration starts, skipping the first `skip` periods."""
    d = [y - x for x, y in pairwise(starts)][skip:]
    return statistics.median(d) / MS if d else float("nan")


# ---------------------------------------------------------------- syncs


def sync_calls(path: str) -> list[dict]:
    """CUDA calls that block the CPU until GPU work is done, by start: stream/device/event
    synchronize, synchronous memcpy, and cudaMemcpyAsync device-to-host into pageable memory
    (synchronous in effect). Each: name, start, end, tid, blocked_ns, sync_type (CUPTI), copy."""
    e = _export(path)
    mem_by_corr = {m.corr: m for m in e.memops if m.op == "memcpy" and m.corr}
    out = []
    for a in e.api:
        copy = mem_by_corr.get(a.corr)
        kind = None
        if a.name in SYNC_API:
            kind = "synchronize"
        elif SYNC_MEMCPY_RE.match(a.name):
            kind = "sync_memcpy"
        elif a.name.startswith("cudaMemcpyAsync") and copy is not None and copy.copy_kind == MEMCPY_DTOH \
                and copy.dst_kind == MEM_PAGEABLE:
            kind = "pageable_dtoh_async"
        if kind is None:
            continue
        out.append({"name": a.name, "kind": kind, "start": a.start, "end": a.end, "tid": a.tid,
                    "blocked_ns": a.end - a.start, "sync_type": e.sync_type_by_corr.get(a.corr),
                    "copy": None if copy is None else {"kind": copy.copy_kind, "bytes": copy.nbytes}})
    return out


def next_gpu_start(path: str, t: int) -> int | None:
    """Start of the first GPU activity (kernel/memcpy/memset) that begins at or after t."""
    starts = _gpu_starts(path)
    i = bisect.bisect_left(starts, t)
    return starts[i] if i < len(starts) else None


@functools.lru_cache(maxsize=64)
def _gpu_starts(path: str) -> list[int]:
    e = _export(path)
    return sorted([k.start for k in e.kernels] + [m.start for m in e.memops])


def gpu_busy_until(path: str, t: int) -> int:
    """End of the GPU-busy interval that contains t, or t when the GPU is idle at t."""
    merged = _export(path).gpu_all
    i = bisect.bisect_right(merged, (t, float("inf"))) - 1
    if i >= 0 and merged[i][0] <= t < merged[i][1]:
        return merged[i][1]
    return t


def idle_after_sync(path: str, syncs: list[dict] | None = None) -> list[dict]:
    """For each sync call: the GPU idle time (all devices of the export) from the call's return
    until the next kernel/memcpy/memset starts. 0 when GPU work is still running at the return."""
    out = []
    for s in (sync_calls(path) if syncs is None else syncs):
        busy_to = gpu_busy_until(path, s["end"])
        nxt = next_gpu_start(path, busy_to)
        idle = 0 if busy_to > s["end"] or nxt is None else nxt - s["end"]
        out.append({**s, "idle_after_ns": idle})
    return out


def idle_union_ns(syncs: list[dict]) -> int:
    """Total GPU idle after the given syncs (from `idle_after_sync`), each idle stretch counted
    once even when several syncs return into it (e.g. back-to-back event syncs)."""
    return sum(b - a for a, b in merge([(x["end"], x["end"] + x["idle_after_ns"])
                                        for x in syncs if x["idle_after_ns"] > 0]))


def between_activity(path: str, intervals: list[tuple[int, int]]) -> dict:
    """Summed over CPU intervals (e.g. between one step range's end and the next one's start on
    the main thread): total ms, GPU busy ms (kernels/memcpy/memset) and compute ms inside them,
    and what the main thread did (NVTX ranges, CUDA API, OS runtime calls), ms per interval."""
    e = _export(path)
    n = max(len(intervals), 1)
    tot = sum(b - a for a, b in intervals)
    agg: dict[str, Counter] = {"nvtx_ns": Counter(), "cuda_api_ns": Counter(), "osrt_ns": Counter()}
    for a, b in intervals:
        act = cpu_activity(path, a, b)
        for key in agg:
            agg[key].update(act[key])
    return {"intervals": len(intervals), "total_ms": _r(tot / MS), "per_interval_ms": _r(tot / MS / n),
            "gpu_busy_ms": _r(sum(covered(e.gpu_all, a, b) for a, b in intervals) / MS),
            "gpu_compute_ms": _r(sum(covered(e.gpu_compute, a, b) for a, b in intervals) / MS),
            "main_thread_ms_per_interval": {f"{k[:-3]}:{name}": _r(v / MS / n)
                                            for k, c in agg.items() for name, v in c.most_common(5)}}


# ---------------------------------------------------------------- utilisation


def compute_idle_fraction(path: str, t0: int, t1: int) -> float:
    """Share of [t0, t1) with no non-NCCL kernel running (waiting in NCCL counts as idle): the
    pipeline bubble as a stage sees it."""
    return 1 - covered(_export(path).gpu_compute, t0, t1) / (t1 - t0)


def gpu_idle_fraction(path: str, t0: int, t1: int) -> float:
    """Share of [t0, t1) with no GPU activity at all (kernels incl. NCCL, memcpy, memset)."""
    return 1 - covered(_export(path).gpu_all, t0, t1) / (t1 - t0)


def nccl_fraction(path: str, t0: int, t1: int) -> float:
    return covered(_export(path).gpu_nccl, t0, t1) / (t1 - t0)


def exposed_nccl_fraction(path: str, t0: int, t1: int) -> float:
    """Share of [t0, t1) with an NCCL kernel running and no compute kernel."""
    e = _export(path)
    nccl = e.gpu_nccl
    both = 0
    for a, b in nccl:
        a, b = max(a, t0), min(b, t1)
        if a < b:
            both += covered(e.gpu_compute, a, b)
    return (covered(nccl, t0, t1) - both) / (t1 - t0)


def gpu_gaps(path: str, t0: int, t1: int, min_ns: int = 1_000_000) -> list[tuple[int, int]]:
    """Idle gaps (no GPU activity) of at least min_ns inside [t0, t1)."""
    out, prev = [], t0
    for a, b in _export(path).gpu_all:
        if b <= t0:
            continue
        if a >= t1:
            break
        if a - prev >= min_ns:
            out.append((prev, a))
        prev = max(prev, b)
    if t1 - prev >= min_ns:
        out.append((prev, t1))
    return out


# ---------------------------------------------------------------- CPU side


def cpu_activity(path: str, t0: int, t1: int, tid: int | None = None) -> dict:
    """What the thread (default: the main thread) did in [t0, t1): ns inside NVTX ranges by text
    (innermost not resolved: every overlapping range counts), in CUDA API calls by name and in
    OS runtime calls by name; the rest is plain CPU (Python) time."""
    e = _export(path)
    tid = main_thread(path) if tid is None else tid

    def overlap(a, b):
        return max(0, min(b, t1) - max(a, t0))

    nv: Counter = Counter()
    for r in e.nvtx:
        if r.tid == tid and r.start < t1 and r.end > t0:
            nv[r.text] += overlap(r.start, r.end)
    api: Counter = Counter()
    for a in e.api:
        if a.tid == tid and a.start < t1 and a.end > t0:
            api[a.name] += overlap(a.start, a.end)
    os_: Counter = Counter()
    for c in e.osrt:
        if c.tid == tid and c.start < t1 and c.end > t0:
            os_[c.name] += overlap(c.start, c.end)
    return {"window_ns": t1 - t0, "nvtx_ns": dict(nv.most_common(8)), "cuda_api_ns": dict(api.most_common(6)),
            "osrt_ns": dict(os_.most_common(6))}


# ---------------------------------------------------------------- across ranks


def clock_residual_across(paths: dict[int, str], regex: str = "AllReduce|AllGather|ReduceScatter|Broadcast",
                          ref: int | None = None) -> dict[int, float]:
    """Median (end_r - end_ref) in µs over the k-th NCCL kernels of each name matching `regex`:
    NCCL collective kernels end within a few µs of each other, so this is the residual clock
    offset of each rank against `ref` (default: the lowest rank)."""
    ref = min(paths) if ref is None else ref
    out = {}
    base = _by_name(paths[ref], regex)
    for r, p in paths.items():
        mine = _by_name(p, regex)
        d = [m.end - b.end for name in base for b, m in zip(base[name], mine.get(name, []), strict=False)]
        out[r] = statistics.median(d) / 1e3 if d else float("nan")
    return out


def _by_name(path: str, regex: str) -> dict[str, list[Kernel]]:
    out: dict[str, list[Kernel]] = defaultdict(list)
    for k in nccl_kernels(path, regex):
        out[k.short].append(k)
    return out


def match_collectives_across(paths: dict[int, str], regex: str) -> list[dict]:
    """The k-th NCCL kernel of each short name matching `regex` on every rank in `paths` (one
    communicator: pass only its member ranks). Each match: name, k, start/end per rank, the rank
    that started last, skew_ns (last start - first start), wait_ns per rank (last start - own)."""
    per = {r: _by_name(p, regex) for r, p in paths.items()}
    names = set.intersection(*(set(d) for d in per.values())) if per else set()
    out = []
    for name in sorted(names):
        n = min(len(per[r][name]) for r in per)
        for k in range(n):
            starts = {r: per[r][name][k].start for r in per}
            ends = {r: per[r][name][k].end for r in per}
            last = max(starts, key=lambda r: starts[r])
            out.append({"name": name, "k": k, "starts": starts, "ends": ends, "last": last,
                        "skew_ns": starts[last] - min(starts.values()),
                        "wait_ns": {r: starts[last] - s for r, s in starts.items()}})
    return sorted(out, key=lambda m: min(m["starts"].values()))


def straggler_across(paths: dict[int, str], regex: str, t0: int | None = None, t1: int | None = None,
                     min_skew_ns: int = 100_000) -> dict:
    """Who arrives last at the collectives matching `regex` (within [t0, t1) when given): per rank
    the number of matches it started last (skew >= min_skew_ns) and the wait it caused the others
    (sum over the others of last start - own start). For the matches a rank was last at: its
    GPU idle time and its main thread's activity between the end of its previous matched
    collective and its late start (what it did while the others were already waiting)."""
    all_ms = match_collectives_across(paths, regex)
    late = Counter()
    caused: Counter = Counter()
    idle: dict[int, list[int]] = defaultdict(list)
    span: dict[int, list[int]] = defaultdict(list)
    doing: dict[int, Counter] = defaultdict(Counter)
    n = 0
    for i, m in enumerate(all_ms):
        first = min(m["starts"].values())
        if (t0 is not None and first < t0) or (t1 is not None and first >= t1):
            continue
        n += 1
        if m["skew_ns"] < min_skew_ns:
            continue
        r = m["last"]
        late[r] += 1
        caused[r] += sum(w for q, w in m["wait_ns"].items() if q != r)
        st = m["starts"][r]
        prev = max((p["ends"][r] for p in all_ms[:i] if p["ends"][r] <= st), default=None)
        if prev is None:
            continue
        span[r].append(st - prev)
        idle[r].append(round(gpu_idle_fraction(paths[r], prev, st) * (st - prev)))
        act = cpu_activity(paths[r], prev, st)
        for key in ("nvtx_ns", "cuda_api_ns", "osrt_ns"):
            for name, v in act[key].items():
                doing[r][f"{key[:-3]}:{name}"] += v
    per = {}
    for r in sorted(paths):
        k = late.get(r, 0)
        per[r] = {"last_count": k, "wait_caused_ms": _r(caused.get(r, 0) / MS),
                  "mean_interval_before_late_arrival_ms": _r(statistics.fmean(span[r]) / MS) if span[r] else 0.0,
                  "mean_gpu_idle_in_that_interval_ms": _r(statistics.fmean(idle[r]) / MS) if idle[r] else 0.0,
                  "main_thread_in_that_interval_ms_per_late_arrival":
                      {name: _r(v / MS / max(k, 1)) for name, v in doing[r].most_common(8)}}
    return {"matches": n, "late_matches": sum(late.values()), "min_skew_ms": min_skew_ns / MS, "per_rank": per}


def _prev_gpu_end(path: str, t: int) -> int:
    merged = _export(path).gpu_all
    i = bisect.bisect_left(merged, (t, -1)) - 1
    return merged[i][1] if i >= 0 else t


# ---------------------------------------------------------------- truth for tests/fixtures/real

# layout (tp, pp, dp), profiled ranks, what decides the diagnosis. Megatron order: stage = rank // (tp*dp).
CAPTURES = {
    "resnet_nw2": {"world": 2, "layout": (1, 1, 2), "steps": r"^Step (\d+) Start$", "kind": "dataloader"},
    "resnet_nw0": {"world": 2, "layout": (1, 1, 2), "steps": r"^Step (\d+) Start$", "kind": "dataloader"},
    "item_sync": {"world": 2, "layout": (1, 1, 2), "steps": None, "kind": "sync"},
    "healthy": {"world": 2, "layout": (1, 1, 2), "steps": None, "kind": "healthy"},
    "gpipe_m4": {"world": 2, "layout": (1, 2, 1), "steps": r"^step (\d+)$", "kind": "pipeline", "m": 4},
    "1f1b_m8": {"world": 2, "layout": (1, 2, 1), "steps": r"^step (\d+)$", "kind": "pipeline", "m": 8},
    "ddp_slowrank": {"world": 2, "layout": (1, 1, 2), "steps": r"^step (\d+)$", "kind": "straggler"},
    "dp2pp2_all": {"world": 4, "layout": (1, 2, 2), "steps": r"^step (\d+)$", "kind": "pp_dp", "m": 4},
    "dp2pp2_stage": {"world": 4, "layout": (1, 2, 2), "steps": r"^step (\d+)$", "kind": "pp_dp", "m": 4},
    "tp2dp2": {"world": 4, "layout": (2, 1, 2), "steps": r"^step (\d+)$", "kind": "healthy"},
}
FILE_RE = re.compile(r"^(?P<cap>.+)_r(?P<rank>\d+)_[^_]+\.\d+\.sqlite(\.gz)?$")


def _r(x: float, nd: int = 2) -> float:
    return round(float(x), nd)


def _stats(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    return {"n": len(xs), "mean": _r(statistics.fmean(xs)), "median": _r(statistics.median(xs)),
            "min": _r(min(xs)), "max": _r(max(xs))}


def rank_summary(path: str, steps_re: str | None, skip: int = 1) -> dict:
    """Per rank: steps (NVTX ranges matching `steps_re`, else kernel bursts from
    `iteration_starts`), step period, GPU busy/idle in the measured window (the steps after the
    first `skip`), host syncs per step on the main thread with the CPU time blocked in them and
    the GPU idle after them (`idle_union_ns`), and what the main thread did between step ranges."""
    out: dict = {}
    e = _export(path)
    if steps_re:
        steps = nvtx_steps(path, steps_re)
        out["steps_source"] = f"nvtx /{steps_re}/"
        out["step_numbers"] = [n for n, _, _ in steps]
        bounds = [s for _, s, _ in steps]
    else:
        name, bounds = iteration_starts(path)
        out["steps_source"] = f"kernel bursts of `{name[:120]}`"
        steps = [(i, s, t) for i, (s, t) in enumerate(zip(bounds, [*bounds[1:], bounds[-1]], strict=True))]
    out["steps_found"] = len(steps)
    if len(steps) < skip + 2:
        return out
    meas = steps[skip:]
    # measured window: from the first measured step's start to the last one's GPU end
    work = step_gpu_work(path, steps) if steps_re else None
    t0 = meas[0][1]
    t1 = max((w.get("gpu_end", 0) for w in work[skip:]), default=meas[-1][2]) if work else bounds[-1]
    t1 = max(t1, meas[-1][2]) if steps_re else t1
    periods = [(b[1] - a[1]) / MS for a, b in pairwise(meas)]
    out["window_ms"] = _r((t1 - t0) / MS)
    out["step_period_ms"] = _stats(periods)
    if steps_re:
        out["step_range_ms"] = _stats([(t - s) / MS for _, s, t in meas])
        out["between_steps_ms"] = _stats([(b[1] - a[2]) / MS for a, b in pairwise(meas)])
        out["step_gpu_span_ms"] = _stats([(w["gpu_end"] - w["gpu_start"]) / MS for w in work[skip:] if w["items"]])
    out["gpu_busy_pct"] = _r(100 * (1 - gpu_idle_fraction(path, t0, t1)))
    out["compute_busy_pct"] = _r(100 * (1 - compute_idle_fraction(path, t0, t1)))
    out["nccl_busy_pct"] = _r(100 * nccl_fraction(path, t0, t1))
    out["exposed_nccl_pct"] = _r(100 * exposed_nccl_fraction(path, t0, t1))
    p2p = merge([(k.start, k.end) for k in nccl_kernels(path, "SendRecv|Send|Recv")])
    n_meas = len(meas) if steps_re else len(meas) - 1
    out["p2p_kernel_ms_per_step"] = _r(covered(p2p, t0, t1) / MS / max(n_meas, 1))
    out["nccl_collective_ms_per_step"] = _r(covered(merge(
        [(k.start, k.end) for k in nccl_kernels(path, "AllReduce|AllGather|ReduceScatter|Broadcast")]), t0, t1)
        / MS / max(n_meas, 1))
    gaps = gpu_gaps(path, t0, t1)
    out["gpu_gaps_ge_1ms"] = {"count": len(gaps), "total_ms": _r(sum(b - a for a, b in gaps) / MS)}
    # what nsys' per-call cost is estimated from: the CUDA calls (any thread) starting in the
    # window, and the GPU's idle between launches (gaps under 1 ms), which caps that cost
    short = [(a, b) for a, b in gpu_gaps(path, t0, t1, min_ns=1) if b - a < 1_000_000]
    out["gpu_gaps_lt_1ms"] = {"count": len(short), "total_ms": _r(sum(b - a for a, b in short) / MS)}
    out["cuda_calls_in_window"] = sum(1 for a in e.api if t0 <= a.start < t1)
    # host syncs inside the measured window, on the main thread
    tid = main_thread(path)
    syncs = [s for s in idle_after_sync(path) if t0 <= s["start"] < t1 and s["tid"] == tid]
    n_steps = len(meas) if steps_re else len(meas) - 1

    def label(x):
        return x["name"] + ("(pageable DtoH)" if x["kind"] == "pageable_dtoh_async" else "")

    by_name = Counter(label(x) for x in syncs)
    per_call = {}
    for name in by_name:
        mine = [x for x in syncs if label(x) == name]
        per_call[name] = {
            "count": len(mine), "per_step": _r(len(mine) / max(n_steps, 1)),
            "blocked_ms_per_step": _r(sum(x["blocked_ns"] for x in mine) / MS / max(n_steps, 1)),
            "gpu_idle_after_ms_per_step": _r(idle_union_ns(mine) / MS / max(n_steps, 1))}
    out["syncs_in_window"] = {"count": len(syncs), "per_step": _r(len(syncs) / max(n_steps, 1)),
                              "blocked_ms_per_step": _r(sum(x["blocked_ns"] for x in syncs) / MS / max(n_steps, 1)),
                              "gpu_idle_after_ms_per_step": _r(idle_union_ns(syncs) / MS / max(n_steps, 1)),
                              "by_call": dict(sorted(per_call.items(), key=lambda kv: -kv[1]["count"]))}
    if steps_re:
        gaps_between = [(a[2], b[1]) for a, b in pairwise(meas)]
        out["between_steps_activity"] = between_activity(path, gaps_between)
        out["between_steps_each_ms"] = [_r((b - a) / MS, 1) for a, b in gaps_between]
    out["_window"] = (t0, t1)
    out["_steps"] = steps
    del e
    return out


def _files(fixtures: str) -> dict[str, dict[int, str]]:
    caps: dict[str, dict[int, str]] = defaultdict(dict)
    for f in sorted(os.listdir(fixtures)):
        m = FILE_RE.match(f)
        if m:
            caps[m["cap"]][int(m["rank"])] = os.path.join(fixtures, f)
    return caps


def capture_truth(name: str, files: dict[int, str]) -> dict:
    """Every number tests/fixtures/real/truth.json holds for one capture (files: rank -> plain .sqlite)."""
    cfg = CAPTURES[name]
    tp, pp, dp = cfg["layout"]
    out: dict = {"world": cfg["world"], "layout": {"tp": tp, "pp": pp, "dp": dp},
                 "profiled_ranks": sorted(files), "files": {r: os.path.basename(p) for r, p in files.items()}}
    out["clock_residual_us_vs_lowest_rank"] = {r: _r(v) for r, v in clock_residual_across(files).items()}
    ranks = {r: rank_summary(p, cfg["steps"]) for r, p in files.items()}
    out["ranks"] = {r: {k: v for k, v in s.items() if not k.startswith("_")} for r, s in ranks.items()}
    for r in ranks:
        out["ranks"][r]["stage"] = r // (tp * dp)
        out["ranks"][r]["dp_index"] = (r // tp) % dp
        out["ranks"][r]["tp_index"] = r % tp
    kind = cfg["kind"]
    if kind == "pipeline" or kind == "pp_dp":
        m = cfg["m"]
        theory = (pp - 1) / (m + pp - 1)
        out["bubble"] = {"theory_pct": _r(100 * theory), "microbatches": m, "stages": pp, "per_rank": {}}
        steps = {r: ranks[r]["_steps"] for r in files}
        works = {r: step_gpu_work(files[r], steps[r]) for r in files}
        nsteps = min(len(v) for v in steps.values())
        for r in files:
            own, common = [], []
            for i in range(1, nsteps):
                w = works[r][i]
                if not w["items"]:
                    continue
                own.append(compute_idle_fraction(files[r], w["gpu_start"], w["gpu_end"]))
                a = min(works[q][i]["gpu_start"] for q in files if works[q][i]["items"])
                b = max(works[q][i]["gpu_end"] for q in files if works[q][i]["items"])
                common.append(compute_idle_fraction(files[r], a, b))
            out["bubble"]["per_rank"][r] = {
                "stage": r // (tp * dp),
                "compute_idle_pct_own_step_span": _r(100 * statistics.fmean(own)) if own else None,
                "compute_idle_pct_common_step_span": _r(100 * statistics.fmean(common)) if common else None,
                "compute_ms_per_step": _r(statistics.fmean(
                    [works[r][i]["compute_ns"] / MS for i in range(1, nsteps) if works[r][i]["items"]]))}
    if kind in ("straggler", "pp_dp", "healthy", "dataloader", "sync"):
        groups = _groups(cfg["layout"], sorted(files))
        out["collectives"] = {}
        for label, members in groups.items():
            sub = {r: files[r] for r in members}
            if len(sub) < 2:
                continue
            t0 = max(ranks[r]["_window"][0] for r in sub if "_window" in ranks[r]) if all(
                "_window" in ranks[r] for r in sub) else None
            t1 = min(ranks[r]["_window"][1] for r in sub) if t0 else None
            out["collectives"][label] = straggler_across(sub, "AllReduce|AllGather|ReduceScatter|Broadcast", t0, t1)
    return out


def _groups(layout: tuple[int, int, int], ranks: list[int]) -> dict[str, list[int]]:
    """Communicator groups present among the profiled ranks: dp groups (same stage and tp index)
    and tp groups (same stage and dp index)."""
    tp, pp, dp = layout
    out: dict[str, list[int]] = {}
    for s in range(pp):
        for t in range(tp):
            members = [r for r in ranks if r // (tp * dp) == s and r % tp == t]
            if dp > 1:
                out[f"dp(stage={s},tp={t})"] = members
        for d in range(dp):
            members = [r for r in ranks if r // (tp * dp) == s and (r // tp) % dp == d]
            if tp > 1:
                out[f"tp(stage={s},dp={d})"] = members
    return out


def step_waits_across(paths: dict[int, str], steps_re: str, victim: int, regex: str = "AllReduce") -> list[dict]:
    """Per measured step of `victim`: how long it waited in the collectives (matching `regex`)
    whose kernels it started inside that step's GPU work (sum and max of last start - own start)."""
    ms = match_collectives_across(paths, regex)
    steps = nvtx_steps(paths[victim], steps_re)
    work = step_gpu_work(paths[victim], steps)
    out = []
    for w in work[1:]:
        if not w["items"]:
            continue
        mine = [m for m in ms if w["gpu_start"] <= m["starts"][victim] <= w["gpu_end"]]
        out.append({"step": w["n"], "collectives": len(mine),
                    "wait_ms": _r(sum(m["wait_ns"][victim] for m in mine) / MS, 1),
                    "max_wait_ms": _r(max((m["wait_ns"][victim] for m in mine), default=0) / MS, 1)})
    return out


def verdict(name: str, t: dict) -> dict:
    """The diagnosis the numbers in `t` (capture_truth output) decide, with its evidence."""
    kind = CAPTURES[name]["kind"]
    ranks = t["ranks"]

    def g(r, *keys, default=None):
        v = ranks[r]
        for k in keys:
            if not isinstance(v, dict) or k not in v:
                return default
            v = v[k]
        return v

    if kind == "dataloader":
        between = {r: g(r, "between_steps_activity", "per_interval_ms") for r in ranks}
        worst = max(between, key=lambda r: between[r])
        return {
            "root_cause": "input pipeline (DataLoader) starves the GPU on every rank",
            "root_cause_ranks": sorted(ranks),
            "slowest_input_rank": worst,
            "evidence": {
                "between_steps_ms_per_step": between,
                "compute_busy_pct": {r: g(r, "compute_busy_pct") for r in ranks},
                "gpu_busy_pct_incl_nccl": {r: g(r, "gpu_busy_pct") for r in ranks},
                "main_thread_between_steps_ms_per_step": {
                    r: g(r, "between_steps_activity", "main_thread_ms_per_interval") for r in ranks}},
            "expect_from_orch": [
                "a data-loader / input-pipeline finding naming every rank (GPU idle between `Step N Start` ranges)",
                "steps found from `Step N Start` (numbers restart at 0 in epoch 1): 12 steps per rank",
                "no pipeline-stage or exposed-communication root cause; NCCL time is waiting for the other rank"]}
    if kind == "sync":
        return {
            "root_cause": "none dominant: launch-bound small model; loss.item() syncs once per step",
            "root_cause_ranks": [],
            "evidence": {
                "step_period_ms": {r: g(r, "step_period_ms", "median") for r in ranks},
                "steps_source": {r: g(r, "steps_source") for r in ranks},
                "item_syncs_per_step (cudaStreamSynchronize)": {
                    r: g(r, "syncs_in_window", "by_call", "cudaStreamSynchronize", "per_step") for r in ranks},
                "gpu_idle_after_item_ms_per_step": {
                    r: g(r, "syncs_in_window", "by_call", "cudaStreamSynchronize", "gpu_idle_after_ms_per_step")
                    for r in ranks},
                "gpu_idle_after_all_syncs_ms_per_step": {
                    r: g(r, "syncs_in_window", "gpu_idle_after_ms_per_step") for r in ranks},
                "gpu_busy_pct": {r: g(r, "gpu_busy_pct") for r in ranks}},
            "expect_from_orch": [
                "iterations inferred without NVTX, period ~= step_period_ms",
                "host syncs every step: 1 cudaStreamSynchronize (loss.item()) + ~6 cudaEventSynchronize per step",
                "GPU idle after those syncs small (~1.2-1.4 ms per ~33.5 ms step); it must not be ranked as the "
                "dominant cause of the GPU idle"]}
    if kind == "healthy":
        return {
            "root_cause": "none (healthy, GPU-bound)",
            "root_cause_ranks": [],
            "evidence": {"gpu_busy_pct": {r: g(r, "gpu_busy_pct") for r in ranks},
                         "compute_busy_pct": {r: g(r, "compute_busy_pct") for r in ranks},
                         "exposed_nccl_pct": {r: g(r, "exposed_nccl_pct") for r in ranks},
                         "step_period_ms": {r: g(r, "step_period_ms", "median") for r in ranks}},
            "expect_from_orch": ["no high-severity finding; GPU busy >= 95% on every rank"]}
    if kind == "pipeline":
        b = t["bubble"]["per_rank"]
        comp = {r: b[r]["compute_ms_per_step"] for r in b}
        heavy = max(comp, key=lambda r: comp[r])
        return {
            "root_cause": f"stage {b[heavy]['stage']} (LM head + loss) is heavier than stage 0: bubble above theory",
            "root_cause_ranks": [heavy],
            "evidence": {"compute_ms_per_step": comp,
                         "compute_ratio_heavy_over_light": _r(comp[heavy] / min(comp.values())),
                         "bubble_pct_per_stage_common_step_span": {
                             r: b[r]["compute_idle_pct_common_step_span"] for r in b},
                         "bubble_theory_pct": t["bubble"]["theory_pct"]},
            "expect_from_orch": [
                f"stage imbalance with stage {b[heavy]['stage']} slowest, "
                f"ratio ~{_r(comp[heavy] / min(comp.values()))}",
                "bubble per stage close to bubble_pct_per_stage_common_step_span, compared with the theory value"]}
    if kind == "straggler":
        coll = next(iter(t["collectives"].values()))["per_rank"]
        late = max(coll, key=lambda r: coll[r]["last_count"])
        return {
            "root_cause": f"rank {late}: per-step metrics (.cpu()) and an evaluation every 4 steps between its "
                          "step ranges; the others wait in the next step's all-reduces",
            "root_cause_ranks": [late],
            "evidence": {"last_arrivals": {r: coll[r]["last_count"] for r in coll},
                         "wait_caused_ms": {r: coll[r]["wait_caused_ms"] for r in coll},
                         "between_steps_each_ms": {r: g(r, "between_steps_each_ms") for r in ranks},
                         "between_steps_main_thread": {r: g(r, "between_steps_activity") for r in ranks},
                         "late_rank_input_wait": "none: its main thread shows no DataLoader queue wait "
                                                 "(sem_clockwait/poll) between steps; the other rank's "
                                                 "between-steps time is ~0.2 ms (batches ready)",
                         "victim_step_waits": t.get("victim_step_waits")},
            "expect_from_orch": [
                f"straggler finding naming rank {late} (binomial test on last arrivals)",
                "its cause placed between the step ranges (outside `step N`), NOT in the input pipeline: "
                "the late rank's between-steps time is GPU evaluation work and host-synchronising metrics"]}
    return {}


def build_truth(fixtures: str) -> dict:
    truth = {"_about": "computed by tests/oracle.py (plain sqlite3) over the fixtures in this folder; "
                       "times in ms unless named _ns/_us; ranks are global ranks"}
    for name, files in sorted(_files(fixtures).items()):
        if name not in CAPTURES:
            continue
        with contextlib.ExitStack() as stack:
            plain = {r: stack.enter_context(decompressed(p)) for r, p in files.items()}
            truth[name] = capture_truth(name, plain)
            truth[name]["files"] = {r: os.path.basename(p) for r, p in files.items()}
            if CAPTURES[name]["kind"] == "straggler":
                coll = next(iter(truth[name]["collectives"].values()))["per_rank"]
                late = max(coll, key=lambda r: coll[r]["last_count"])
                victim = next(r for r in plain if r != late)
                truth[name]["victim_step_waits"] = {"victim": victim, "late": late, "steps": step_waits_across(
                    plain, CAPTURES[name]["steps"], victim)}
            truth[name]["verdict"] = verdict(name, truth[name])
    return truth


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("fixtures")
    ap.add_argument("-o", "--output")
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args(argv)
    truth = build_truth(a.fixtures)
    if a.only:
        truth = {k: v for k, v in truth.items() if k in a.only or k.startswith("_")}
    text = json.dumps(truth, indent=1, sort_keys=False, default=str)
    if a.output:
        with open(a.output, "w") as f:
            f.write(text + "\n")
    else:
        sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
