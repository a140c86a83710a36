"""Report.tables past TABLE_RANKS ranks: the rows of the ranks that matter only, so the report
and the analysis's memory stay flat in the number of ranks. 80 synthetic ranks (5 steps, two
kernels each); rank 57's `gemm` takes 3x as long (an outlier every table flags). Expected
values: plain sqlite3 over rank 57's export."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from rich.console import Console

from orchestrator.analyze import stats_tables as tables_mod
from orchestrator.analyze.build import build_report
from orchestrator.collect.collect import collect
from orchestrator.layout import Layout
from orchestrator.metrics.engine import Options
from orchestrator.report.html import render_html
from orchestrator.report.terminal import print_report
from tests.synthetic import MS, Export

pytestmark = pytest.mark.replay

RANKS, SLOW = 80, 57


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("in")
    for rank in range(RANKS):
        e = Export(d / f"syn_1_r{rank}_h{rank // 8}.{100 + rank}.sqlite", rank)
        for step in range(5):
            t0 = step * 20 * MS
            e.nvtx(t0, t0 + 20 * MS, f"step {step}")
            gemm = (6 if rank == SLOW else 2) * MS + rank * 1000
            e.kernel(t0 + 100_000, t0 + MS, t0 + MS + gemm, "gemm")
            e.kernel(t0 + 200_000, t0 + 9 * MS, t0 + 10 * MS, "elementwise")
        e.close()
    return d


@pytest.fixture(scope="module")
def store(exports: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return collect([exports], tmp_path_factory.mktemp("run"), layout=Layout(), workers=2).store


def test_tables_keep_the_ranks_that_matter(exports: Path, store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = build_report(store, Options())
    t = report.tables
    assert t.kept_ranks is not None and len(t.kept_ranks) == tables_mod.TABLE_RANKS
    assert SLOW in t.kept_ranks
    assert {r.rank for r in t.kernels} == set(t.kept_ranks) == {r.rank for r in t.phases}
    slow = {r.name: r for r in t.kernels if r.rank == SLOW}
    assert slow["gemm"].outlier
    (src,) = exports.glob(f"syn_1_r{SLOW}_*.sqlite")
    con = sqlite3.connect(src)  # the window is steps 1-4 (step 0 is warm-up): kernels from 20 ms on
    n, total = con.execute("SELECT count(*), sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s "
                           "ON s.id = k.shortName WHERE s.value = 'gemm' AND k.start >= ?", [20 * MS]).fetchone()
    con.close()
    assert report.window.note == "steps after each rank's first" and n == 4
    assert (slow["gemm"].count, slow["gemm"].total_ms) == (n, total / 1e6)
    # The same rows as when every rank is kept, for the kept ranks.
    monkeypatch.setattr(tables_mod, "TABLE_RANKS", RANKS)
    every = build_report(store, Options()).tables
    assert every.kept_ranks is None and {r.rank for r in every.kernels} == set(range(RANKS))
    assert [r for r in every.kernels if r.rank in t.kept_ranks] == t.kernels
    assert [r for r in every.phases if r.rank in t.kept_ranks] == t.phases
    # Said where the tables are shown.
    console = Console(record=True, width=240, color_system=None)
    print_report(report, console)
    assert f"tables: the rows of 64 of {RANKS} ranks" in " ".join(console.export_text().split())
    assert 'id="tables-ranks"' in render_html(report)
