"""Report.tables against NVIDIA's own numbers: `nsys stats` (2022.4, which reads the 2025.3
exports too) run over the same exports, its CSVs stored in tests/fixtures/stats/. orch's
tables are computed over the whole capture for this (Options(stats_scope="capture")), since
`nsys stats` has no step window; the window itself is checked against plain sqlite3."""

from __future__ import annotations

import csv
import gzip
import re
import shutil
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from orchestrator.analyze.build import build_report
from orchestrator.analyze.stats_tables import _sources
from orchestrator.collect.collect import collect
from orchestrator.collect.identity import Layout
from orchestrator.metrics.engine import Options
from orchestrator.store.tables import OSRT_MIN_NS
from tests.conftest import h200_fixtures

pytestmark = pytest.mark.replay

HERE = Path(__file__).parent / "fixtures"
STATS = HERE / "stats"
NS = 2.0  # ns: orch's ms carry 6 decimals; nsys rounds means to 0.1 ns


def _unzip(gzs: list[Path], dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for gz in gzs:
        with gzip.open(gz, "rb") as fi, open(dest / gz.name.removesuffix(".gz"), "wb") as fo:
            shutil.copyfileobj(fi, fo)
    return dest


def _reports(tmp: Path, name: str, gzs: list[Path]) -> dict[str, object]:
    d = _unzip(gzs, tmp / name / "in")
    res = collect([d], tmp / name / "run", layout=Layout())
    assert res.ok_ranks == [0, 1]
    return {"capture": build_report(res.store, Options(stats_scope="capture")),
            "window": build_report(res.store, Options(tables="all")), "files": sorted(d.glob("*.sqlite"))}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    tmp = tmp_path_factory.mktemp("stats")
    out = {"ok": _reports(tmp, "ok", sorted((HERE / "gpu_e2e").glob("ok_r*.sqlite.gz"))),
           "cpu": _reports(tmp, "cpu", sorted(STATS.glob("cpu_r*.sqlite.gz")))}
    straggler = sorted((h200_fixtures() / "ddp_straggler").glob("*.sqlite.gz"))
    out["ddp_straggler"] = _reports(tmp, "ddp_straggler", straggler)
    return out


def _csv(stem: str, report: str) -> list[dict[str, str]]:
    (path,) = STATS.glob(f"{stem}_{report}.csv")
    return list(csv.DictReader(path.open()))


def _stems(run: str) -> dict[int, str]:
    return {int(re.search(r"_r(\d+)_", p.name).group(1)): p.name.removesuffix("_nvtxsum.csv")
            for p in STATS.glob(f"{run}_r*_nvtxsum.csv")}


def _close(ms: float, ns: str | float) -> bool:
    return abs(ms * 1e6 - float(ns)) <= NS


GROUPABLE = re.compile(r"^(NCCL:\w+|[A-Za-z_]+|step \d+)$")  # names outside autograd-nvtx's op ranges


@pytest.mark.parametrize("run", ["ok", "ddp_straggler", "cpu"])
def test_phases_match_nvtx_sum(runs, run: str) -> None:
    rep = runs[run]["capture"]
    rows = {(p.rank, p.range): p for p in rep.tables.phases}
    checked = 0
    for rank, stem in _stems(run).items():
        groups: dict[str, list[dict[str, str]]] = defaultdict(list)
        for r in _csv(stem, "nvtxsum"):
            if GROUPABLE.match(r["Range"]):
                groups[re.sub(r"\s*\d+$", "", r["Range"])].append(r)
        for grp, rs in groups.items():
            p = rows.get((rank, grp))
            if p is None:  # the report keeps the TOP_PHASES heaviest groups (autograd-nvtx makes hundreds)
                assert grp not in ("step", "forward", "backward", "data_load", "optimizer"), (run, rank, grp)
                continue
            assert p.count == sum(int(r["Instances"]) for r in rs), (run, rank, grp)
            assert _close(p.total_ms, sum(int(r["Total Time (ns)"]) for r in rs))
            assert _close(p.min_ms, min(int(r["Min (ns)"]) for r in rs))
            assert _close(p.max_ms, max(int(r["Max (ns)"]) for r in rs))
            if len(rs) == 1:  # `step 3` rows are one group in orch
                r = rs[0]
                assert _close(p.median_ms, r["Med (ns)"]) and _close(p.mean_ms, r["Avg (ns)"])
                assert abs(p.std_ms * 1e6 - float(r["StdDev (ns)"])) <= 1.0 + 1e-6 * float(r["StdDev (ns)"])
            checked += 1
    assert checked >= 8


def test_gpu_projection_matches_nvtxgpuproj(runs) -> None:
    rows = {(p.rank, p.range): p for p in runs["ok"]["capture"].tables.phases}
    for rank, stem in _stems("ok").items():
        proj: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        for r in _csv(stem, "nvtxgpuproj"):
            g = proj[re.sub(r"\s*\d+$", "", r["Name"])]
            g[0] += int(r["NumGPUOps"])
            g[1] += int(r["Projected Duration (ns)"])
        for grp in ("forward", "backward", "data_load", "optimizer", "step", "NCCL:ncclAllReduce"):
            p = rows[(rank, grp)]
            assert p.gpu_ops == proj[grp][0], (rank, grp)
            assert _close(p.gpu_span_ms, proj[grp][1]), (rank, grp)
            assert p.gpu_ms <= p.gpu_span_ms + 1e-6  # the union never exceeds the span


@pytest.mark.parametrize("run", ["ok", "ddp_straggler"])
def test_kernels_and_memory_match_nsys_stats(runs, run: str) -> None:
    t = runs[run]["capture"].tables
    kern = {(k.rank, k.name): k for k in t.kernels}
    mem = {(m.rank, m.op): m for m in t.memory if m.host_kind == "all"}
    for rank, stem in _stems(run).items():
        by: dict[str, list[dict[str, str]]] = defaultdict(list)
        for r in _csv(stem, "gpukernsum"):
            by[r["Name"]].append(r)
        top = sorted(by, key=lambda n: -sum(int(r["Total Time (ns)"]) for r in by[n]))[:10]
        for name in top:  # nsys splits a kernel by grid/block: summed here
            k, rs = kern[(rank, name)], by[name]
            assert k.count == sum(int(r["Instances"]) for r in rs)
            assert _close(k.total_ms, sum(int(r["Total Time (ns)"]) for r in rs))
            assert _close(k.min_ms, min(int(r["Min (ns)"]) for r in rs))
            assert _close(k.max_ms, max(int(r["Max (ns)"]) for r in rs))
            if len(rs) == 1:
                assert _close(k.median_ms, rs[0]["Med (ns)"])
        sizes = {r["Operation"]: r for r in _csv(stem, "gpumemsizesum")}
        for r in _csv(stem, "gpumemtimesum"):
            op = re.sub(r"^\[CUDA (memcpy )?|\]$", "", r["Operation"])
            m = mem[(rank, op)]
            assert m.count == int(r["Count"])
            assert _close(m.total_ms, r["Total Time (ns)"]) and _close(m.median_ms, r["Med (ns)"])
            assert _close(m.min_ms, r["Min (ns)"]) and _close(m.max_ms, r["Max (ns)"])
            assert m.mb == pytest.approx(float(sizes[r["Operation"]]["Total (MB)"]), abs=0.0006)


@pytest.mark.parametrize("run", ["ok", "ddp_straggler", "cpu"])
def test_calls_match_cuda_api_sum_and_osrt_sum(runs, run: str) -> None:
    api = {(a.rank, a.api, a.name): a for a in runs[run]["capture"].tables.api if a.tid is None}
    checked = 0
    for rank, stem in _stems(run).items():
        reports = ["osrtsum"] + ([] if run == "cpu" else ["cudaapisum"])
        for rep in reports:
            kind = "osrt" if rep == "osrtsum" else "cuda"
            rows = _csv(stem, rep)
            if kind == "osrt":  # the store keeps OS calls >= OSRT_MIN_NS only: compare names all above it
                rows = [r for r in rows if int(r["Min (ns)"]) >= OSRT_MIN_NS]
            for r in rows[:5]:
                a = api[(rank, kind, r["Name"])]
                assert a.count == int(r["Num Calls"]), (run, rank, r["Name"])
                assert _close(a.total_ms, r["Total Time (ns)"]) and _close(a.median_ms, r["Med (ns)"])
                assert _close(a.min_ms, r["Min (ns)"]) and _close(a.max_ms, r["Max (ns)"])
                checked += 1
    assert checked >= 4


def test_cpu_window_against_sqlite_and_the_planted_slow_rank(runs) -> None:
    """Window scope (steps after the first) from plain sqlite3; rank 1's data_load sleeps 20 ms more."""
    rep = runs["cpu"]["window"]
    rows = {(p.rank, p.range): p for p in rep.tables.phases}
    for rank, f in enumerate(runs["cpu"]["files"]):
        con = sqlite3.connect(f)
        text = "coalesce(e.text, (SELECT value FROM StringIds WHERE id = e.textId))"
        steps = con.execute(f"SELECT e.start, e.end FROM NVTX_EVENTS e WHERE {text} LIKE 'step %' "
                            "AND e.end IS NOT NULL ORDER BY e.start").fetchall()[1:]  # all but the first
        s0, s1 = steps[0][0], steps[-1][1]
        n, total = con.execute(f"SELECT count(*), sum(e.end - e.start) FROM NVTX_EVENTS e WHERE {text} = "
                               "'data_load' AND e.start >= ? AND e.start < ?", [s0, s1]).fetchone()
        p = rows[(rank, "data_load")]
        assert p.count == n == 7 and _close(p.total_ms, total) and _close(p.per_step_ms, total / 7)
    assert rows[(1, "data_load")].cpu_outlier and not rows[(0, "data_load")].cpu_outlier
    main = [t for t in rep.tables.threads if t.rank == 1 and t.role == "main"]
    assert main and main[0].top_wait == "clock_nanosleep"


def test_straggler_window_tables(runs) -> None:
    """The planted slow rank 1 (sleep in data_load) stands out in the phase and thread tables."""
    t = runs["ddp_straggler"]["window"].tables
    dl = {p.rank: p for p in t.phases if p.range == "data_load"}
    assert dl[1].cpu_outlier and not dl[0].cpu_outlier and dl[1].per_step_ms > 50 * dl[0].per_step_ms
    main = {x.rank: x for x in t.threads if x.role == "main"}
    assert main[1].top_wait == "clock_nanosleep" and main[1].blocked_pct > 80
    assert {x.role for x in t.threads} >= {"main", "autograd", "nccl"}
    assert any(k.cls == "communication" for k in t.kernels) and any(k.cls == "compute" for k in t.kernels)
    low = {s.rank for s in t.low_util_slices}
    assert low == {1}  # rank 0's GPU is busy waiting in NCCL kernels


def test_waiting_rank_outliers_are_marked_apart(runs) -> None:
    """Rank 0 waits for the planted slow rank 1: its outliers (longer NCCL / blocking ranges) are
    marked as waiting, not as a second culprit, in the HTML and on the terminal."""
    import re as _re

    from rich.console import Console

    from orchestrator.report.tables_html import stats_html
    from orchestrator.report.tables_terminal import print_tables

    rep = runs["ddp_straggler"]["window"]
    assert rep.waits_for() == {0: [1]}
    out0 = [p for p in rep.tables.phases if p.rank == 0 and (p.cpu_outlier or p.gpu_outlier)]
    out1 = [p for p in rep.tables.phases if p.rank == 1 and (p.cpu_outlier or p.gpu_outlier)]
    assert out0 and out1  # both ranks stand out somewhere; only rank 1 is late
    html = stats_html(rep)
    phases = html[html.index('id="phases"'):html.index("</table>", html.index('id="phases"'))]
    rows = _re.findall(r"<tr>(.*?)</tr>", phases)
    marks = {(int(_re.match(r'<td class="num">(\d+)</td>', r).group(1)), m)
             for r in rows for m in _re.findall(r'class="num (out|wait)"', r)}
    assert marks == {(0, "wait"), (1, "out")}, marks
    assert "Orange: the same on a rank that waits for a late one" in html
    con = Console(record=True, width=250, color_system="truecolor")
    print_tables(rep, con)
    text = con.export_text()
    assert "(wait), yellow: waits for a late rank" in text and "0 (wait)" in text


def test_ms_of_integer_ns_needs_no_rounding() -> None:
    """tables.ms6 skips round() for integer ns; it must give what round(ns / 1e6, 6) gives, bit
    for bit, at every magnitude (durations to epoch timestamps), and still round the rest."""
    import random

    from orchestrator.analyze.stats_tables import ms6 as ms

    rng = random.Random(16)
    ints = [rng.randint(-(1 << e), 1 << e) for e in range(63) for _ in range(3000)]
    ints += [0, 1, 999_999, 1_000_001, 2**53 - 1, 2**53 + 1, 2**62, -(2**62)]
    assert [ms(n) for n in ints] == [round(float(n) / 1e6, 6) for n in ints]
    assert all(type(ms(n)) is float for n in ints[:10])
    floats = [rng.uniform(0, 1e13) for _ in range(20_000)] + [2.5e-7, 1234.5000005, 1e18 / 3]
    assert [ms(x) for x in floats] == [round(x / 1e6, 6) for x in floats]
    assert ms(1234.5) == 0.001234 and ms(None) is None  # a float ns is still cut to 6 decimals


def test_library_domains_and_one_off_ranges_are_shown_apart(runs) -> None:
    """The loop's own ranges first; NCCL's domain after them, marked as a library's (nsys names
    the domain in the range's group)."""
    for run in ("ok", "ddp_straggler"):
        phases = runs[run]["capture"].tables.phases
        kinds = [p.source for p in phases]
        assert kinds == sorted(kinds, key=["loop", "library", "once"].index), run
        assert {p.source for p in phases if p.range.startswith("NCCL:")} == {"library"}, run
        assert {p.source for p in phases if not p.range.startswith("NCCL:")} == {"loop"}, run
    rows = [{"grp": "setup", "n": 1, "per_step_ns": 5.0, "rank": 0}, {"grp": "setup", "n": 1, "per_step_ns": 4.0},
            {"grp": "warmup", "n": 1, "per_step_ns": 5.0}, {"grp": "warmup", "n": 3, "per_step_ns": 5.0},
            {"grp": "init", "n": 1, "per_step_ns": None}, {"grp": "CCCL:cub::DeviceScan", "n": 1, "per_step_ns": 1.0}]
    assert _sources(rows, ["CCCL"]) == {"setup": "once", "warmup": "loop", "init": "loop",
                                        "CCCL:cub::DeviceScan": "library"}
