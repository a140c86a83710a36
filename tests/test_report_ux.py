"""The report as a person sees it: the aligned timeline of a real 2-rank H200 run checked in
Chromium against the store, a CPU-only report without GPU bars, heatmaps at 1,024 ranks,
and a terminal that fits 100 columns with the top finding first."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

from orchestrator.analyze.model_report import CpuPhase, Finding, StepRow, StepTime
from orchestrator.analyze.model_timeline import Extras
from orchestrator.errors import OrchError
from orchestrator.report.html import render_html
from orchestrator.sweep import apply, combinations, parse_set
from tests.browser import dump_dom, screenshot
from tests.conftest import REPO, run_orch
from tests.rulekit import context, rank
from tests.synthetic import MS, Export

pytestmark = [pytest.mark.jobs, pytest.mark.browser]

FIXTURE = REPO / "tests" / "fixtures" / "gpu_e2e"
SHOTS = Path("/tmp/orch-shots")  # screenshots kept for a person to look at


def _shot(html: Path, name: str, tmp: Path, size: str = "1250,2400") -> None:
    SHOTS.mkdir(exist_ok=True)
    screenshot(html, SHOTS / f"{name}.png", tmp / f"profile-{name}", size)


@pytest.fixture(scope="module")
def ddp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("ddp")
    p = run_orch("analyze", *map(str, sorted(FIXTURE.glob("ddp_r*.sqlite.gz"))), "--out", str(d / "store"),
                 "--html", str(d / "r.html"), "--json", str(d / "r.json"), env={"COLUMNS": "200"})
    assert p.returncode == 0, p.stderr
    (d / "stdout.txt").write_text(p.stdout)
    return d


def _store_waits(store: Path, t0: int, t1: int) -> dict[tuple[int, int], int]:
    """Independent of the analysis SQL: the k-th NCCL collective of one name on each rank is one
    collective; a rank waits from its start until the last rank's start (at most its length)."""
    con = duckdb.connect(str(store), read_only=True)
    rows = con.execute("""SELECT rank, short_name, start, "end" FROM kernels
                          WHERE short_name LIKE 'nccl%' ORDER BY rank, short_name, start""").fetchall()
    con.close()
    kth: dict[tuple[int, str], int] = {}
    coll: dict[tuple[str, int], list[tuple[int, int, int]]] = {}
    for rk, name, s, e in rows:
        k = kth[(rk, name)] = kth.get((rk, name), -1) + 1
        coll.setdefault((name, k), []).append((rk, s, e))
    waits = {}
    for members in coll.values():
        if len(members) < 2:
            continue
        latest = max(s for _, s, _ in members)
        for rk, s, e in members:
            wait = min(latest - s, e - s)
            if wait > 0 and t0 <= s < t1:
                waits[(rk, s)] = wait
    return waits


def test_gpu_timeline_lanes_and_waits_match_the_store(ddp: Path, tmp_path: Path) -> None:
    dom = dump_dom(ddp / "r.html", tmp_path / "profile")
    _shot(ddp / "r.html", "gpu-ddp-report", tmp_path)
    views = re.findall(r'<svg id="timeline-(\d)"[^>]*data-step="(\d+)" data-t0-ns="(\d+)"[^>]*>(.*?)</svg>', dom, re.S)
    assert len(views) == 2  # the representative and the slowest step
    for _, _step, t0s, body in views:
        lanes = re.findall(r'<g class="lane" data-rank="(\d+)" data-role="(\w*)">(.*?)</g>', body, re.S)
        assert sorted(int(r) for r, _, _ in lanes) == [0, 1]  # one lane per shown rank
        roles = {int(r): role for r, role, _ in lanes}
        assert roles[1] == "root" and roles[0] == "victim"
        t0 = int(t0s)
        t1 = t0 + int(1e6 * max(float(e) for e in re.findall(r'data-e="([\d.]+)"', body)))
        store = _store_waits(ddp / "store" / "profile.duckdb", t0, t1)
        big = {k: v for k, v in store.items() if v >= 1e6}
        assert big and {rk for rk, _ in big} == {0}  # rank 0 waits for the late rank 1
        for rk, _, lane in lanes:
            segs = [(float(s), float(e)) for s, e in re.findall(
                r'data-kind="comm waiting" data-s="([\d.]+)" data-e="([\d.]+)"', lane)]
            expect = sorted(((s - t0) / 1e6, (s - t0 + w) / 1e6) for (r, s), w in big.items() if r == int(rk))
            got = [g for g in segs if g[1] - g[0] >= 1.0]
            assert len(got) == len(expect), (rk, got, expect)
            for (gs, ge), (es, ee) in zip(sorted(got), expect, strict=True):
                assert abs(gs - es) < 0.01 and abs(ge - ee) < 0.01
        assert re.search(r'<g class="path" data-root="1" data-victim="0">', body)  # the root-cause path
        assert 'class="tl-nvtx"' in body and "data_load" in body
    heat = re.search(r'<svg id="wait-heatmap".*?</svg>', dom, re.S).group(0)
    assert len(re.findall(r'class="cell"', heat)) == 2 * 5  # 2 ranks x the 5 analysed steps


def test_terminal_fits_100_columns_top_finding_first(ddp: Path) -> None:
    text = (ddp / "stdout.txt").read_text()
    lines = text.splitlines()
    # A line naming the output folder (collect's `store: PATH ...`) holds a path as long as the
    # folder's, kept whole in a pipe so that it can be copied; the report's own lines fit.
    fits = [line for line in lines if str(ddp) not in line]
    assert max(len(line) for line in fits) <= 100, max(fits, key=len)
    first = next(i for i, line in enumerate(lines) if line.startswith("1. "))
    assert "straggler" in lines[first] and first < next(i for i, line in enumerate(lines) if "per rank" in line)
    wide = run_orch("report", str(ddp / "store" / "profile.duckdb"), "--wide", env={"COLUMNS": "200"})
    assert wide.returncode == 0 and "syncs/step" in wide.stdout and max(map(len, wide.stdout.splitlines())) > 100


def _cpu_exports(d: Path) -> list[Path]:
    """Two CPU-only ranks (NVTX, no CUDA) with rank 1 slow in data_load, 6 steps of ~50 ms."""
    files = []
    for rk in (0, 1):
        f = d / f"cpu_r{rk}.sqlite"
        ex = Export(f, rk)
        for i in range(6):
            t = i * 60 * MS
            load = 35 * MS if rk == 1 else 1 * MS
            ex.nvtx(t, t + 50 * MS, f"step {i}")
            ex.nvtx(t + MS // 10, t + MS // 10 + load, "data_load")
            ex.nvtx(t + load + MS // 5, t + 49 * MS, "backward" if rk == 0 else "forward")
        ex.close()
        files.append(f)
    return files


def test_cpu_only_report_has_no_gpu_parts(tmp_path: Path) -> None:
    files = _cpu_exports(tmp_path)
    p = run_orch("analyze", *map(str, files), "--out", str(tmp_path / "store"), "--html", str(tmp_path / "r.html"))
    assert p.returncode == 0, p.stderr
    dom = dump_dom(tmp_path / "r.html", tmp_path / "profile")
    _shot(tmp_path / "r.html", "cpu-synthetic-report", tmp_path)
    assert 'id="cpu-only"' in dom and 'id="rank-bars"' not in dom and 'class="seg"' not in dom
    assert "GPU idle" not in dom and 'id="stage-bars"' not in dom and 'id="wait-heatmap"' not in dom
    assert 'id="problems"' not in dom and "CUPTI" not in dom
    phases = re.search(r'<svg id="phase-bars".*?</svg>', dom, re.S).group(0)
    assert {r for r in re.findall(r'class="phase" data-rank="(\d+)"', phases)} == {"0", "1"}
    heat = re.search(r'<svg id="step-heatmap".*?</svg>', dom, re.S).group(0)
    assert len(re.findall(r'class="cell"', heat)) == 2 * 6  # every rank and step, from the NVTX steps
    tl = re.search(r'<svg id="timeline-0".*?</svg>', dom, re.S).group(0)
    assert sorted(re.findall(r'<g class="lane" data-rank="(\d+)"', tl)) == ["0", "1"]
    assert 'data-kind="compute"' not in tl and "data_load" in tl


def _big_report(n: int = 1024, steps: int = 20):
    slow = 777
    ranks = [rank(rk, window_ms=1000.0, nccl_wait_ms=0.0 if rk == slow else 300.0, gpu_idle_pct=2.0 + rk % 7,
                  step_ms=[StepTime(step=s, ms=50.0 + (40.0 if rk == slow else rk % 5), warmup=s == 0)
                           for s in range(steps)]) for rk in range(n)]
    rows = [StepRow(step=s, ms_by_rank={str(r.rank): r.step_ms[s].ms for r in ranks}, spread_ms=44.0, warmup=s == 0)
            for s in range(steps)]
    evidence = [line for rk in range(n) for line in (f"rank {rk}: waited 300 ms", f"rank {rk}'s loop was in poll")]
    f = Finding(kind="straggler", severity="high", ranks=[slow], title="rank 777 is a straggler", evidence=evidence,
                fix="y", cost_ms=1.0, victims=[r for r in range(n) if r != slow])
    ctx = context(ranks, steps=rows, findings=[f])
    ctx.report.findings = [f]
    wait = {r.rank: {s: (0.0 if r.rank == slow else 30.0) for s in range(1, steps)} for r in ranks}
    return ctx.report, Extras(wait_ms=wait), slow



def test_cpu_phase_bars_at_1024_ranks_show_the_named_rank_and_the_extremes() -> None:
    """The phase bars pick ranks as the other views do (rank_pick.py): the rank a finding names (here
    a middling one), the 8 with the most and the least CPU time a step, then an even sample."""
    from orchestrator.report.cpu_html import phase_bars

    report, _, slow = _big_report()
    report.cpu_phases = [CpuPhase(rank=rk, range="forward", ms_per_step=10.0 + (rk * 37) % 1024 / 10, steps=19)
                         for rk in range(1024)]
    svg = phase_bars(report)
    shown = [int(r) for r in re.findall(r'<text x="0" y="\d+">rank (\d+)</text>', svg)]
    by_time = sorted(range(1024), key=lambda rk: ((rk * 37) % 1024, rk))
    assert len(shown) == 48 and shown == sorted(shown)
    assert slow in shown and set(by_time[:8] + by_time[-8:]) <= set(shown)


def test_heatmaps_and_bars_scale_to_1024_ranks(tmp_path: Path) -> None:
    report, extras, slow = _big_report()
    html = tmp_path / "big.html"
    html.write_text(render_html(report, extras))
    dom = dump_dom(html, tmp_path / "profile")
    _shot(html, "heatmap-1024-ranks", tmp_path, "1250,2200")
    heat = re.search(r'<svg id="step-heatmap"[^>]*height="(\d+)"[^>]*>(.*?)</svg>', dom, re.S)
    assert int(heat.group(1)) < 900  # 64 rows of 16 ranks, not 1,024 rows
    cells = re.findall(r'<rect class="cell" data-rank="(\d+)" data-step="(\d+)" data-n="(\d+)"', heat.group(2))
    assert len(cells) == 64 * 20 and all(n == "16" for _, _, n in cells)
    # The straggler's bin shows the straggler (worst rank of the bin), on every steady step.
    assert {int(rk) for rk, st, _ in cells if st != "0" and 768 <= int(rk) < 784} == {slow}
    wait = re.search(r'<svg id="wait-heatmap".*?</svg>', dom, re.S).group(0)
    assert len(re.findall(r'class="cell"', wait)) == 64 * 19
    # Waiting bins show the rank that waits least: the straggler, whom the others wait for.
    assert f'data-rank="{slow}"' in wait
    bars = re.search(r'<svg id="rank-bars".*?</svg>', dom, re.S).group(0)
    shown = {int(r) for r in re.findall(r'class="seg" data-rank="(\d+)"', bars)}
    assert len(shown) <= 48 and slow in shown
    # A finding with a line or two per rank shows its first 8 and folds the other 2,040, closed.
    cell = re.search(r'<table id="findings">.*?</table>', dom, re.S).group(0)
    first = re.search(r"<td><ul>(.*?)</ul>", cell, re.S).group(1)
    assert re.findall(r"<li>(.*?)</li>", first) == report.findings[0].evidence[:8]
    fold = re.search(r'<details class="more-evidence"( open="")?><summary>(\d+) more</summary><ul>(.*?)</ul>',
                     cell, re.S)
    assert fold.group(1) is None and fold.group(2) == str(2 * 1024 - 8)
    assert re.findall(r"<li>(.*?)</li>", fold.group(3)) == report.findings[0].evidence[8:]
    odd = render_html(report.model_copy(update={"findings": [report.findings[0].model_copy(
        update={"ranks": list(range(1, 1024, 2))})]}), extras)
    cell = re.search(r'<table id="findings">.*?</table>', odd, re.S).group(0)
    assert "1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, … (512 ranks)" in cell
    every = re.search(r'<details class="all-ranks">.*?</details>', cell).group(0)
    assert ", ".join(map(str, range(1, 1024, 2))) in every


def test_terminal_at_1024_ranks_stays_short() -> None:
    from io import StringIO

    from rich.console import Console

    from orchestrator.report.terminal import print_report

    report, _, slow = _big_report()
    buf = StringIO()
    print_report(report, Console(file=buf, width=200, soft_wrap=True))
    lines = buf.getvalue().splitlines()
    assert max(map(len, lines)) <= 100 and len(lines) < 40
    assert any(re.match(rf"\s+{slow}\s", line) for line in lines) and "1008 more rank(s)" in buf.getvalue()


def test_terminal_thread_table_at_1024_ranks_shows_the_named_rank() -> None:
    """`--tables all` at many ranks: the thread table shows the ranks rank_pick chooses (the
    straggler a finding names first, then an even sample), a few threads each, not the first
    ranks' threads in rank order."""
    from io import StringIO

    from rich.console import Console

    from orchestrator.analyze.model_stats_tables import StatsTables, ThreadRow
    from orchestrator.report.tables_terminal import TOP, print_tables

    report, _, slow = _big_report()
    report.tables = StatsTables(shown="all", threads=[
        ThreadRow(rank=rk, tid=t, thread=f"t{t}", role="other", span_ms=100.0, launch_ms=1.0, sync_ms=0.0,
                  wait_ms=float(t), blocked_ms=float(t), blocked_pct=float(t)) for rk in range(1024) for t in range(6)])
    buf = StringIO()
    print_tables(report, Console(file=buf, width=200))
    text = buf.getvalue()
    rows = [line.split("│")[1:3] for line in text[text.index("threads: blocked"):].splitlines() if line.count("│") > 3]
    ranks = [int(r.strip()) for r, _ in rows]
    assert slow in ranks and len(set(ranks)) == TOP and len(rows) == 4 * TOP
    assert [t.strip() for r, t in rows if int(r) == slow] == ["t5", "t4", "t3", "t2"]  # most blocked first


def test_sweep_set_parsing() -> None:
    assert parse_set("launch.env.NUM_WORKERS=0,2,4") == ("launch.env.NUM_WORKERS", ["0", "2", "4"])
    assert len(combinations([("a", ["1", "2"]), ("b", ["x", "y", "z"])])) == 6
    for bad in ("nokey", "=1", "a..b=1", "a=1,,2"):
        with pytest.raises(OrchError):
            parse_set(bad)
    spec = {"launch": {"args": ["--slow-ms", "20"], "nproc_per_node": 2}, "profile": {"delay": 1}}
    apply(spec, "launch.args.1", "0")
    apply(spec, "launch.env.NUM_WORKERS", "4")
    apply(spec, "launch.nproc_per_node", "4")
    assert spec["launch"] == {"args": ["--slow-ms", "0"], "nproc_per_node": 4, "env": {"NUM_WORKERS": "4"}}
    with pytest.raises(OrchError):
        apply(spec, "launch.args.9", "1")
    with pytest.raises(OrchError):
        apply(spec, "launch.nproc_per_node", "many")
