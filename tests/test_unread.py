"""Where every rank was mapped, the report's analysis runs over empty views of the gated event
tables (metrics/unread.py): it never binds their parts, its report is the in-process store's,
and where a gate opens after all (another scope than the maps', a rank whose map is not this
SQL's) it runs again over the real views and gives what it gives without them."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest
from rich.console import Console

from orchestrator.analyze.build import report_from_views
from orchestrator.collect.collect import collect, collect_parts
from orchestrator.collect.pipeline import CollectResult
from orchestrator.layout import Layout
from orchestrator.metrics import unread
from orchestrator.metrics.engine import Options, Views, attach_store, prepare, run_sql
from orchestrator.timings import TIMINGS
from tests.stores import Stores
from tests.test_parts import edit_map_table

pytestmark = pytest.mark.replay

QUIET = Console(stderr=True, quiet=True)
CASE = "ddp_straggler"
AGAIN = "analyze: SQL again, over the events"


@pytest.fixture(scope="module")
def both(stores: Stores, gpu_fixtures: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(in-process store, the session's; parts store with every rank mapped and every event
    table a view)."""
    tmp = tmp_path_factory.mktemp("unread")
    return stores.store(gpu_fixtures / CASE), _mapped(gpu_fixtures / CASE, tmp / "a").store


def _mapped(src: Path, run: Path) -> CollectResult:
    """The parts route of the exports in `src` into `run`, every rank mapped, every event table
    with rows a view."""
    return collect_parts([src], run, layout=Layout(), console=QUIET, workers=2, summaries=True, view_min_rows=0)


def _report(store: Path, opts: Options, tables: list[str] | None) -> tuple[dict, bool]:
    """(the JSON report of `store`'s analysis, with `tables` run over empty views first (None:
    as the analysis chooses), whether it ran again over the events)."""
    TIMINGS.reset(True)
    try:
        con = attach_store(store)
        try:
            run_sql(con, opts, unread_tables=tables)
            report = report_from_views(Views(con), store, opts).model_dump(mode="json")
        finally:
            con.close()
        again = any(name == AGAIN for name, _, _ in TIMINGS.rows())
    finally:
        TIMINGS.reset(False)
    report.pop("store")
    report.pop("outcome")
    return report, again


def _candidates(store: Path) -> list[str]:
    con = attach_store(store)
    try:
        prepare(con, Options())
        return unread.candidates(con)
    finally:
        con.close()


def test_mapped_ranks_leave_every_gated_view_unbound(both: tuple[Path, Path], gpu_fixtures: Path,
                                                    tmp_path: Path) -> None:
    """With the gated tables' parts spoiled (their sizes kept, so the store opens), the report of
    a parts store whose ranks were all mapped is still the in-process store's: no statement bound
    them. A query of them fails, so the check can fail."""
    ref, _ = both
    store = _mapped(gpu_fixtures / CASE, tmp_path / "a").store
    tables = _candidates(store)
    assert {"cuda_api", "kernels", "osrt", "threads"} <= set(tables) <= set(unread.GATED)
    for t in tables:
        for f in (tmp_path / "a" / "parts").glob(f"table={t}/*/*.parquet"):
            f.write_bytes(b"\0" * f.stat().st_size)
    with duckdb.connect(str(store), read_only=True) as con, pytest.raises(duckdb.Error):
        con.execute("SELECT count(*) FROM kernels").fetchall()
    report, again = _report(store, Options(), None)
    assert not again
    assert report == _report(ref, Options(), None)[0]


@pytest.mark.parametrize("opts", [Options(steps=(2, 3)), Options(gap_ms=2.0), Options(stats_scope="capture"),
                                  Options(steps_from="^optimizer$")],
                         ids=["steps", "gap_ms", "stats_scope", "steps_from"])
def test_a_gate_that_opens_runs_the_analysis_again(both: tuple[Path, Path], opts: Options) -> None:
    """Options whose scope is not the maps': the analysis does not try the empty views, and where
    made to, a gate opens, it runs again over the events, and the report is the one without
    them (and the in-process store's)."""
    ref, store = both
    tables = _candidates(store)
    forced, again = _report(store, opts, tables)
    assert again
    plain, again = _report(store, opts, None)
    assert not again and forced == plain == _report(ref, opts, None)[0]


def test_a_rank_mapped_by_another_sql_is_computed_from_its_events(both: tuple[Path, Path], tmp_path: Path,
                                                                   gpu_fixtures: Path) -> None:
    """A rank whose map ran other SQL: the analysis reads its events (the gate map_none holds it),
    so it does not try the empty views; made to, it runs again and gives the same report."""
    ref, store = both
    tables = _candidates(store)
    _mapped(gpu_fixtures / CASE, tmp_path / "a")
    edit_map_table(tmp_path / "a" / "parts", 1, "map_scope", "'other ' || sql AS sql")
    res = _mapped(gpu_fixtures / CASE, tmp_path / "a")
    assert res.mapped == 0  # the edited part is reused as it is
    assert _candidates(res.store) == []
    forced, again = _report(res.store, Options(), tables)
    assert again
    assert forced == _report(res.store, Options(), None)[0] == _report(ref, Options(), None)[0]


def test_a_rank_without_a_report_needs_no_events(gpu_fixtures: Path, tmp_path: Path) -> None:
    """A third rank whose export cannot be read (status error, no events): the others' maps
    still leave the gated views unbound, and the report is the in-process store's."""
    src = tmp_path / "src"
    src.mkdir()
    files = sorted((gpu_fixtures / CASE).glob("*.sqlite"))
    for f in files:
        shutil.copy(f, src / f.name)
    (src / "ddp_straggler_r2_vm.9999.sqlite").write_bytes(files[0].read_bytes()[:50_000])  # cut short
    ref = collect([src], tmp_path / "ref", layout=Layout(), console=QUIET)
    store = _mapped(src, tmp_path / "a").store
    with duckdb.connect(str(store), read_only=True) as con:
        assert con.execute("SELECT list(status ORDER BY rank) FROM ranks").fetchone()[0] == ["ok", "ok", "error"]
    assert _candidates(store)
    report, again = _report(store, Options(), None)
    assert not again
    assert report == _report(ref.store, Options(), None)[0]


def test_a_moved_run_gets_its_own_views_back(both: tuple[Path, Path], gpu_fixtures: Path, tmp_path: Path) -> None:
    """A mapped run moved with its parts: the analysis's own views over the parts where they are
    now (views.relocate) make way for the empty ones and come back after, as the timeline and
    the Python API read them: the same rows as the in-process store's. Dropped instead, the reads
    would fall through to the store's views of the folder the run left; kept empty, read none."""
    ref, _ = both
    _mapped(gpu_fixtures / CASE, tmp_path / "a")
    shutil.move(tmp_path / "a", tmp_path / "moved")
    store = tmp_path / "moved" / "profile.duckdb"
    tables = _candidates(store)
    assert {"kernels", "osrt"} <= set(tables)
    report, again = _report(store, Options(), None)
    assert not again and report == _report(ref, Options(), None)[0]
    read = "SELECT count(*) FROM query_table(?::VARCHAR)"
    con = attach_store(store)
    try:
        run_sql(con, Options())
        after = {t: con.execute(read, [t]).fetchone() for t in tables}
    finally:
        con.close()
    with duckdb.connect(str(ref), read_only=True) as con:
        assert after == {t: con.execute(read, [t]).fetchone() for t in tables}
