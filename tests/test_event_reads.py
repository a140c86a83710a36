"""Where every rank was mapped in the report's own scope, the analysis reads no row of the event
tables that only per-rank files read (CUDA calls, kernels, copies, memsets, OS-runtime calls,
threads): those files do not run (metrics/rankpass.py) and no other statement names the tables,
so on the parts route their views over the Parquet parts are never bound. Where a rank needs its
events after all (another scope than the maps', a map of other SQL), the per-rank pass reads its
rows, and the report is the in-process store's either way."""

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
from orchestrator.metrics.engine import Options, Views, attach_store, run_sql
from tests.stores import Stores
from tests.test_parts import edit_map_table, rank_lists

pytestmark = pytest.mark.replay

QUIET = Console(stderr=True, quiet=True)
CASE = "ddp_straggler"
# The event tables that only the per-rank files read.
PER_RANK = ("cuda_api", "kernels", "memcpy", "memset", "osrt", "threads")


@pytest.fixture(scope="module")
def both(stores: Stores, gpu_fixtures: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(in-process store, the session's; parts store with every rank mapped and every event
    table a view)."""
    tmp = tmp_path_factory.mktemp("event_reads")
    return stores.store(gpu_fixtures / CASE), _mapped(gpu_fixtures / CASE, tmp / "a").store


def _mapped(src: Path, run: Path) -> CollectResult:
    """The parts route of the exports in `src` into `run`, every rank mapped, every event table
    with rows a view."""
    return collect_parts([src], run, layout=Layout(), console=QUIET, workers=2, summaries=True, view_min_rows=0)


def report(store: Path, opts: Options) -> dict:
    """The JSON report of `store`'s analysis, without the store's own path and outcome."""
    con = attach_store(store)
    try:
        run_sql(con, opts)
        out = report_from_views(Views(con), store, opts).model_dump(mode="json")
    finally:
        con.close()
    out.pop("store")
    out.pop("outcome")
    return out


def spoil_event_parts(store: Path) -> list[str]:
    """Overwrite the parts of the PER_RANK tables that `store` reads from its parts (their sizes
    kept, so the store opens): a statement that binds one fails. Returns those tables."""
    with duckdb.connect(str(store), read_only=True) as con:
        viewed = con.execute("SELECT value FROM meta WHERE key = 'event_views'").fetchone()[0].split(",")
    tables = [t for t in PER_RANK if t in viewed]
    for t in tables:
        for f in (store.parent / "parts").glob(f"table={t}/*/*.parquet"):
            f.write_bytes(b"\0" * f.stat().st_size)
    with duckdb.connect(str(store), read_only=True) as con, pytest.raises(duckdb.Error):
        con.execute(f"SELECT count(*) FROM {tables[0]}").fetchall()
    return tables


def test_mapped_ranks_bind_no_event_view(both: tuple[Path, Path], gpu_fixtures: Path, tmp_path: Path) -> None:
    """With the per-rank event tables' parts spoiled, the report of a parts store whose ranks
    were all mapped is still the in-process store's: no statement bound them."""
    ref, _ = both
    store = _mapped(gpu_fixtures / CASE, tmp_path / "a").store
    assert {"cuda_api", "kernels", "osrt", "threads"} <= set(spoil_event_parts(store))
    assert report(store, Options()) == report(ref, Options())


@pytest.mark.parametrize("opts", [Options(steps=(2, 3)), Options(gap_ms=2.0), Options(stats_scope="capture"),
                                  Options(steps_from="^optimizer$")],
                         ids=["steps", "gap_ms", "stats_scope", "steps_from"])
def test_options_of_another_scope_read_the_events(both: tuple[Path, Path], opts: Options) -> None:
    """Options whose scope is not the maps': no rank's statistics nor GPU ops are the map's, the
    per-rank pass reads every rank's events, and the report is the in-process store's."""
    ref, store = both
    assert rank_lists(store, opts, "map_ranks", "ops_mapped") == [[], []]
    assert report(store, opts) == report(ref, opts)


def test_a_rank_mapped_by_another_sql_is_computed_from_its_events(both: tuple[Path, Path], tmp_path: Path,
                                                                   gpu_fixtures: Path) -> None:
    """A rank whose map ran other SQL: the analysis reads its events (map_none holds it) and
    takes the other rank's map."""
    ref, _ = both
    _mapped(gpu_fixtures / CASE, tmp_path / "a")
    edit_map_table(tmp_path / "a" / "parts", 1, "map_scope", "'other ' || sql AS sql")
    res = _mapped(gpu_fixtures / CASE, tmp_path / "a")
    assert res.mapped == 0  # the edited part is reused as it is
    assert rank_lists(res.store, Options(), "map_none", "ops_mapped", "map_ranks") == [[-1, 1], [0], [0]]
    assert report(res.store, Options()) == report(ref, Options())


def test_a_rank_without_a_report_needs_no_events(gpu_fixtures: Path, tmp_path: Path) -> None:
    """A third rank whose export cannot be read (status error, no events): the others' maps
    still leave the event views unbound, and the report is the in-process store's."""
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
    spoil_event_parts(store)
    assert report(store, Options()) == report(ref.store, Options())


def test_a_moved_run_reads_its_own_parts(both: tuple[Path, Path], gpu_fixtures: Path, tmp_path: Path) -> None:
    """A mapped run moved with its parts: the analysis's own views over the parts where they are
    now (views.relocate) are what the timeline and the Python API read after it: the same rows
    as the in-process store's, not the store's views of the folder the run left."""
    ref, _ = both
    _mapped(gpu_fixtures / CASE, tmp_path / "a")
    shutil.move(tmp_path / "a", tmp_path / "moved")
    store = tmp_path / "moved" / "profile.duckdb"
    assert report(store, Options()) == report(ref, Options())
    read = "SELECT count(*) FROM query_table(?::VARCHAR)"
    con = attach_store(store)
    try:
        run_sql(con, Options())
        after = {t: con.execute(read, [t]).fetchone() for t in PER_RANK}
    finally:
        con.close()
    with duckdb.connect(str(ref), read_only=True) as con:
        assert after == {t: con.execute(read, [t]).fetchone() for t in PER_RANK}
