"""GPU memory over time and allocator churn on real captures (tests/fixtures/modern, see its
README): orch's bytes in use at the window's start, peak, end, growth per step and its
malloc/free counts against plain sqlite3 over the same exports; the findings on the loops
that leak or churn and their twins that do not. Multi-rank: no multi-GPU capture with memory
events exists, so ranks are made from one real export with its allocation sizes scaled."""

from __future__ import annotations

import bisect
import gzip
import json
import os
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from orchestrator.analyze.build import report_from_views
from orchestrator.analyze.model_report import Report
from orchestrator.collect.collect import collect
from orchestrator.layout import Layout
from orchestrator.metrics.engine import Options, analysis
from tests.conftest import REPO, need, run_orch
from tests.independent import gpu_gaps, gpu_ops

pytestmark = pytest.mark.replay

MODERN = Path(os.environ.get("ORCH_MODERN_FIXTURES", REPO / "tests" / "fixtures" / "modern"))
DEVICE_KINDS = (2, 3, 5)  # ENUM_CUDA_MEM_KIND: device, array, device static
ALLOC_API = re.compile(r"^(cudaMalloc|cudaMallocAsync|cudaMallocFromPoolAsync|cudaMallocManaged|cudaMallocPitch|"
                       r"cudaMalloc3D|cuMemAlloc|cuMemAllocAsync|cuMemAllocFromPoolAsync|cuMemAllocManaged|"
                       r"cuMemAllocPitch|cuMemCreate)(_v\d+)?$")
FREE_API = re.compile(r"^(cudaFree|cudaFreeAsync|cuMemFree|cuMemFreeAsync|cuMemRelease)(_v\d+)?$")


def _export(name: str, dest: Path) -> Path:
    """The capture's export, decompressed under `dest`/<name>/ (one rank per capture)."""
    need(MODERN.is_dir(), f"{MODERN} (real memory captures) not found")
    (gz,) = sorted(MODERN.glob(f"{name}_r0_*.sqlite.gz"))
    out = dest / name / gz.name[: -len(".gz")]
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(gz, "rb") as fi, open(out, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    return out


class Truth:
    """Memory in use and allocator calls of one export, from plain sqlite3 and Python, in the
    export's own time base (a single rank's store clock is the same). The step ranges are the
    only input taken from orch (these loops have no NVTX: orch infers the iterations, which
    tests/test_*steps* check); the window is recomputed from them as the README defines it:
    [first start, last end] of the GPU work launched inside the selected steps (all but the
    first), an op belonging to the step its CUDA launch call started in."""

    def __init__(self, path: Path, steps: list[tuple[int, int, int]]) -> None:
        con = sqlite3.connect(path)
        steps = sorted(steps, key=lambda x: x[0])
        first = min(n for *_, n in steps)
        sel = [(s, e) for s, e, n in steps if n > first]
        starts = [s for s, _e, _n in steps]
        self.step_starts = [s for s, _ in sel]
        # iterations: a selected step's start to the next step's start (the last: its end)
        self.iterations = [(s, next((x for x in starts if x > s), e)) for s, e in sel]
        launch = dict(con.execute("SELECT correlationId, start FROM CUPTI_ACTIVITY_KIND_RUNTIME"))
        ops = []
        for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
            for s, e, corr in con.execute(f"SELECT start, end, correlationId FROM {table}"):
                t = launch.get(corr)
                if t is not None and any(a <= t < b for a, b in sel):
                    ops.append((s, e))
        self.w0, self.w1 = min(s for s, _ in ops), max(e for _, e in ops)
        kinds = ",".join(map(str, DEVICE_KINDS))
        self.device = con.execute(f"SELECT deviceId FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memKind IN ({kinds}) "
                                  "GROUP BY deviceId ORDER BY count(*) DESC LIMIT 1").fetchone()[0]
        self.events = con.execute(
            f"SELECT start, memoryOperationType, bytes FROM CUDA_GPU_MEMORY_USAGE_EVENTS "
            f"WHERE memKind IN ({kinds}) AND deviceId = ? ORDER BY start", [self.device]).fetchall()
        self.capacity = con.execute("SELECT totalMemory FROM TARGET_INFO_GPU WHERE id = ?",
                                    [self.device]).fetchone()[0]
        strings = dict(con.execute("SELECT id, value FROM StringIds"))
        self.calls = [(s, e, strings[n]) for s, e, n in con.execute(
            "SELECT start, end, nameId FROM CUPTI_ACTIVITY_KIND_RUNTIME")
            if ALLOC_API.match(strings[n]) or FREE_API.match(strings[n])]
        con.close()
        self.times, self.cum, total = [], [], 0  # running sum after each event, in time order
        for s, op, b in self.events:
            total += b if op == 0 else -b
            self.times.append(s)
            self.cum.append(total)
        self.baseline = max(0, -min(self.cum, default=0))

    def level(self, t: int) -> int:
        """Bytes in use after every event at or before t."""
        i = bisect.bisect_right(self.times, t)
        return self.baseline + (self.cum[i - 1] if i else 0)

    def peak(self) -> int:
        inside = [self.level(s) for s, _, _ in self.events if self.w0 < s <= self.w1]
        return max([self.level(self.w0), *inside])

    def growth(self) -> float:
        ys = [self.level(s) for s in self.step_starts]
        n = len(ys)
        mx, my = (n - 1) / 2, sum(ys) / n
        return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sum((i - mx) ** 2 for i in range(n))

    def counts(self) -> tuple[int, int]:
        inside = [op for s, op, _ in self.events if self.w0 <= s <= self.w1]
        return inside.count(0), inside.count(1)

    def alloc_gaps(self, path: Path) -> tuple[int, int]:
        """(count, ns) of the GPU's idle gaps in the window (between the union of its kernels,
        copies and memsets) that the allocation and free calls fill at least a quarter of."""
        con = sqlite3.connect(path)
        ops = sorted((max(s, self.w0), min(e, self.w1))
                     for s, e in gpu_ops(con, 'WHERE "end" > ? AND start < ?', (self.w0, self.w1)))
        con.close()
        n = ns = 0
        for a, b in gpu_gaps(ops):
            filled = sum(min(b, e) - max(a, s) for s, e, _ in self.calls if s < b and e > a)
            if 4 * filled >= b - a:
                n, ns = n + 1, ns + b - a
        return n, ns

    def api_per_step(self) -> tuple[float, float]:
        placed = [name for s, _e, name in self.calls if any(a <= s < b for a, b in self.iterations)]
        n = len(self.iterations)
        return (sum(1 for x in placed if ALLOC_API.match(x)) / n, sum(1 for x in placed if FREE_API.match(x)) / n)


def fan_out(src: Path, dest: Path, factors: list[int], extra: dict[int, int] | None = None) -> Path:
    """Ranks 0..n-1 made from one real export: rank k's allocation and free sizes are the
    source's times factors[k]; `extra` {rank: bytes} adds one allocation at the capture's
    first memory event that is never freed (a rank holding more, e.g. pipeline stage 0)."""
    dest.mkdir(parents=True)
    for k, f in enumerate(factors):
        out = dest / f"mem_r{k}_vm.{1000 + k}.sqlite"
        shutil.copyfile(src, out)
        con = sqlite3.connect(out)
        con.execute("UPDATE CUDA_GPU_MEMORY_USAGE_EVENTS SET bytes = bytes * ?", [f])
        if extra and k in extra:
            con.execute("INSERT INTO CUDA_GPU_MEMORY_USAGE_EVENTS (start, globalPid, deviceId, contextId, address, "
                        "pc, bytes, memKind, memoryOperationType) SELECT start, globalPid, deviceId, contextId, 1, pc, "
                        "?, memKind, 0 FROM CUDA_GPU_MEMORY_USAGE_EVENTS WHERE memKind = 2 ORDER BY start LIMIT 1",
                        [extra[k]])
        con.commit()
        con.close()
    return dest


# The captures (README of tests/fixtures/modern): the same eager GPT loop, plain; keeping every
# step's outputs; calling torch.cuda.empty_cache() every step; all with --cuda-memory-usage=true.
FLAT, LEAK, CHURN = "gpt_eager_memusage", "gpt_eager_keepoutputs_memusage", "gpt_eager_emptycache_memusage"
MEMORY_KINDS = {"memory_growth", "memory_near_capacity", "allocator_churn"}


def _analyze(inputs: list[Path], run: Path) -> tuple[Report, dict[int, list[tuple[int, int, int]]]]:
    """orch's report of `inputs`, and each rank's step ranges (start, end, step) on the store clock."""
    res = collect(inputs, run, layout=Layout())
    con, v = analysis(res.store, Options())
    try:
        steps: dict[int, list[tuple[int, int, int]]] = {}
        for r in v.query('SELECT rank, start, "end", step FROM steps ORDER BY rank, start'):
            steps.setdefault(r["rank"], []).append((r["start"], r["end"], r["step"]))
        assert not v.query("SELECT rank FROM ranks WHERE clock_offset_ns <> 0 AND rank = 0")
        return report_from_views(v, res.store, Options()), steps
    finally:
        con.close()


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Report, Truth]]:
    root = tmp_path_factory.mktemp("modern-memory")
    out = {}
    for name in (FLAT, LEAK, CHURN):
        export = _export(name, root / "in")
        report, steps = _analyze([export.parent], root / "run" / name)
        out[name] = (export, report, Truth(export, steps[0]))
    return out


@pytest.mark.parametrize("name", [FLAT, LEAK, CHURN])
def test_bytes_and_calls_match_sqlite(captures, name: str) -> None:
    _export_path, report, t = captures[name]
    assert report.memory is not None and report.memory.source == "cuda_memory_usage"
    m = report.memory.rank(0)
    assert m is not None
    assert (m.device, m.capacity_bytes, m.baseline_bytes) == (t.device, t.capacity, t.baseline)
    assert (m.start_bytes, m.peak_bytes, m.end_bytes) == (t.level(t.w0), t.peak(), t.level(t.w1))
    assert m.capture_peak_bytes == t.baseline + max(t.cum)
    assert m.headroom_bytes == t.capacity - t.peak()
    assert m.steps == len(t.step_starts) and m.growth_bytes_per_step == pytest.approx(t.growth(), abs=0.1)
    assert (m.allocs, m.frees) == t.counts()
    allocs, frees = t.api_per_step()
    assert (m.alloc_calls_per_step, m.free_calls_per_step) == (round(allocs, 3), round(frees, 3))
    print(f"{name}: {len(t.step_starts)} steps, start {m.start_bytes} peak {m.peak_bytes} end {m.end_bytes} B, "
          f"growth {m.growth_bytes_per_step} B/step, events {m.allocs}/{m.frees}, "
          f"calls/step {m.alloc_calls_per_step}/{m.free_calls_per_step}, CPU {m.alloc_api_pct} %")


def test_agrees_with_the_fixtures_own_truth(captures) -> None:
    """truth.json (tests/fixtures/modern/truth.py, plain sqlite3 with the script's own optimizer
    steps, one `lpnorm_cleanup` kernel each): the kept outputs add exactly 128 MiB a step (16 x
    256 x 8192 fp32 logits), empty_cache() leaves no growth and makes 38 cudaMalloc + 38 cudaFree
    per steady step. (Its memory sums include 64 KiB of pinned host memory, so peaks differ.)"""
    truth = json.loads((MODERN / "truth.json").read_text())

    def entry(name: str) -> dict:
        (key,) = [k for k in truth if k.startswith(f"{name}_r0_")]
        return truth[key]

    leak = captures[LEAK][1].memory.rank(0)
    assert leak.growth_bytes_per_step == entry(LEAK)["memory"]["growth_bytes_per_step"] == 128 * 2**20
    churn, t = captures[CHURN][1].memory.rank(0), entry(CHURN)
    assert churn.growth_bytes_per_step == t["memory"]["growth_bytes_per_step"] == 0
    steady = t["steady"]
    assert churn.alloc_calls_per_step == pytest.approx(steady["cudaMalloc_calls"] / steady["steps"], abs=0.5)
    assert churn.free_calls_per_step == pytest.approx(steady["cudaFree_calls"] / steady["steps"], abs=0.5)


def test_leak_and_churn_found_their_twins_clean(captures) -> None:
    kinds = {name: {f.kind for f in rep.findings} & MEMORY_KINDS for name, (_p, rep, _t) in captures.items()}
    assert kinds == {FLAT: set(), LEAK: {"memory_growth"}, CHURN: {"allocator_churn"}}
    leak = captures[LEAK][1].memory.rank(0)
    (grow,) = [f for f in captures[LEAK][1].findings if f.kind == "memory_growth"]
    assert leak.steps_to_full == pytest.approx((leak.capacity_bytes - leak.end_bytes) / leak.growth_bytes_per_step,
                                               abs=0.1)
    assert f"{leak.steps_to_full:.0f} more steps" in grow.evidence[0]
    (churn,) = [f for f in captures[CHURN][1].findings if f.kind == "allocator_churn"]
    c = captures[CHURN][1].memory.rank(0)
    assert c.sync_frees_per_step == c.free_calls_per_step > 2  # every free here is a cudaFree
    assert "empty_cache()" in churn.fix and churn.cost_ms > 0


def test_allocator_churn_costs_the_gpu_gaps_its_calls_fill(captures) -> None:
    """The churning loop's finding counts the GPU gaps in the window that its cudaMalloc/cudaFree
    calls fill at least a quarter of, as plain sqlite3 finds them (the union of kernels, copies
    and memsets; the window from orch's steps); the plain loop has no such finding."""
    export, rep, truth = captures[CHURN]
    n, ns = truth.alloc_gaps(export)
    (f,) = [f for f in rep.findings if f.kind == "allocator_churn"]
    line = next(e for e in f.evidence if "gaps they fill at least a quarter of" in e)
    assert f"{n} gaps they fill at least a quarter of, {round(ns / 1e6, 3)} ms" in line, (line, n, ns)
    assert 0 < f.cost_ms < ns / 1e6
    assert not [f for f in captures[FLAT][1].findings if f.kind == "allocator_churn"]


def test_diff_flags_the_leaking_run(captures, tmp_path: Path) -> None:
    from orchestrator.report.diff import diff_reports

    flat, leak = captures[FLAT][1], captures[LEAK][1]
    regressed = {r["metric"] for r in diff_reports(flat, leak)["regressions"]}
    assert {"peak_gpu_memory_gib", "gpu_memory_growth_mib_per_step"} <= regressed
    assert not {r["metric"] for r in diff_reports(leak, flat)["regressions"]} & {
        "peak_gpu_memory_gib", "gpu_memory_growth_mib_per_step"}
    # Only the peak differs (+20 %): the CLI's exit status is the memory row's.
    bigger = flat.model_copy(deep=True)
    r0 = bigger.memory.rank(0)
    r0.peak_bytes = int(r0.peak_bytes * 1.2)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(flat.model_dump_json())
    b.write_text(bigger.model_dump_json())
    worse = run_orch("diff", str(a), str(b))
    assert worse.returncode == 1 and "peak_gpu_memory_gib" in worse.stdout, worse.stdout + worse.stderr
    same = run_orch("diff", str(a), str(a))
    assert same.returncode == 0, same.stdout + same.stderr


def test_ranks_compared_on_scaled_copies_of_a_real_export(captures, tmp_path: Path) -> None:
    """Four ranks from the leaking capture: sizes x2, x1, x3, x1, and rank 1 holding one more
    allocation that takes its peak to ~92 % of the GPU. Expected peaks are sqlite3's over
    each file; the rank with the highest peak and the spread follow from them."""
    src, _rep, t = captures[LEAK]
    factors = [2, 1, 3, 1]
    extra = {1: int(0.92 * t.capacity) - t.peak()}
    ranks_dir = fan_out(src, tmp_path / "ranks", factors, extra)
    report, steps = _analyze([ranks_dir], tmp_path / "run")
    m = report.memory
    assert m is not None and [r.rank for r in m.ranks] == [0, 1, 2, 3]
    want = {k: Truth(f, steps[k]).peak() for k, f in enumerate(sorted(ranks_dir.glob("*.sqlite")))}
    assert {r.rank: r.peak_bytes for r in m.ranks} == want
    assert want[1] >= 0.9 * t.capacity and want[2] == 3 * t.peak() and want[0] == 2 * t.peak()
    assert m.peak_rank == 1 and m.spread_bytes == want[1] - min(want.values())
    assert m.max_peak_bytes == want[1] and m.min_peak_bytes == want[3]
    (near,) = [f for f in report.findings if f.kind == "memory_near_capacity"]
    assert near.ranks == [1] and near.evidence[-1].startswith("highest peak on rank 1; peaks across 4 ranks")
    (grow,) = [f for f in report.findings if f.kind == "memory_growth"]
    assert grow.ranks == [0, 1, 2, 3]
    assert m.rank(2).growth_bytes_per_step == pytest.approx(3 * m.rank(3).growth_bytes_per_step, abs=1)
    from orchestrator.report.memory_html import memory_section

    html = memory_section(report)
    assert f"Highest peak: rank 1 ({want[1] / 2**30:.2f} GiB); peaks across 4 ranks" in html
    bars = html[html.index('id="memory-bars"'):]
    bars = bars[:bars.index("</svg>")]
    assert [int(x) for x in re.findall(r">rank (\d+)</text>", bars)] == [0, 1, 2, 3]
    assert [c.rank for c in m.curves] == [0, 1, 2, 3]


def test_html_and_terminal_show_memory(captures) -> None:
    from orchestrator.report.html import render_html
    from orchestrator.report.memory_terminal import memory_line

    leak = captures[LEAK][1]
    page = render_html(leak)
    section = page[page.index("<h2>GPU memory per rank</h2>"):]
    assert 'id="memory-bars"' in section and 'id="memory-curves"' in section
    m = leak.memory.rank(0)
    label = f"peak {m.peak_bytes / 2**30:.2f} GiB ({m.peak_pct:.1f} %), {m.growth_bytes_per_step / 2**20:+.1f} MiB/step"
    assert label in section
    assert len(leak.memory.curves) == 1 and len(leak.memory.curves[0].bytes) == len(leak.memory.curve_t_ms) == 121
    assert max(leak.memory.curves[0].bytes) == m.capture_peak_bytes  # the highest bucket holds the capture's peak
    line = memory_line(leak)
    assert line is not None and line.startswith(f"GPU memory: peak {m.peak_bytes / 2**30:.2f} GiB of ")
    assert f"growth {m.growth_bytes_per_step / 2**20:+.1f} MiB/step (rank 0)" in line


def test_capture_without_memory_events_says_how_to_record_them(tmp_path: Path) -> None:
    """The NVTX twin was profiled without --cuda-memory-usage: the table is absent from its
    export, the rank lists gpu_memory as untraced, and the report has no memory numbers, no
    memory finding, and (with allocator calls in its steps) the hint."""
    export = _export("gpt_eager_nvtx", tmp_path / "in")
    con = sqlite3.connect(export)
    has_table = con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'CUDA_GPU_MEMORY_USAGE_EVENTS'").fetchone()
    con.close()
    assert has_table == (0,)
    res = collect([export.parent], tmp_path / "run", layout=Layout())
    con, v = analysis(res.store, Options())
    try:
        assert "gpu_memory" in v.scalar("SELECT untraced FROM ranks WHERE rank = 0").split(",")
        report = report_from_views(v, res.store, Options())
    finally:
        con.close()
    assert not {f.kind for f in report.findings} & MEMORY_KINDS
    m = report.memory
    assert m is not None and m.source == "none" and m.hint is not None and "--cuda-memory-usage=true" in m.hint
    assert [r.peak_bytes for r in m.ranks] == [None] and m.curves == []
