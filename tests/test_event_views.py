"""A store of the parts route reads its large event tables from the parts (store/views.py):
the rows are the in-process store's (test_parts.py, every fixture); here, what the views add:
a run directory moved with its parts still reports the same, a store whose parts are gone
says so in one line with the fix, `--copy-events` gives a store that stands alone, and
aligned clocks move the viewed rows as they move the copied ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest
from rich.console import Console

from orchestrator.collect.collect import collect, collect_parts
from orchestrator.collect.pipeline import CollectResult
from orchestrator.layout import Layout
from orchestrator.sqltext import file_literal
from orchestrator.store.tables import TABLES
from orchestrator.store.views import (
    IF_MAPPED,
    UNREAD,
    VIEW_MIN_ROWS,
    VIEWABLE,
    create_views,
    parts_select,
    view_sql,
)
from tests.conftest import run_orch
from tests.stores import Stores
from tests.test_parts import _has_rows, assert_same_report, assert_same_store, table_types

pytestmark = pytest.mark.replay

QUIET = Console(stderr=True, quiet=True)
CASE = "ddp_straggler"


def _parts(src: Path, run: Path, **kw: object) -> CollectResult:
    """The parts route with every viewable table that has rows as a view, whatever its size."""
    return collect_parts([src], run, layout=Layout(), console=QUIET, workers=2, **{"view_min_rows": 0, **kw})


def _sums(store: Path) -> dict[str, tuple]:
    """Rows and time sums of every viewable table, read by plain DuckDB over the store file."""
    with duckdb.connect(str(store), read_only=True) as con:
        return {t: con.execute(f"SELECT count(*), sum(start) FROM {t}").fetchone() for t in VIEWABLE}


def test_a_run_moved_with_its_parts_reads_them_where_they_are(stores: Stores, gpu_fixtures: Path,
        tmp_path: Path) -> None:
    ref = stores.store(gpu_fixtures / CASE)
    res = _parts(gpu_fixtures / CASE, tmp_path / "a")
    assert {"kernels", "osrt"} <= set(res.views) and "cuda_api" not in res.views  # read by most files: copied
    assert table_types(res.store) == dict.fromkeys(res.views, "VIEW")
    shutil.move(tmp_path / "a", tmp_path / "moved")
    moved = tmp_path / "moved" / "profile.duckdb"
    assert_same_report(ref, moved)
    assert run_orch("report", str(moved)).returncode == 0


def test_a_store_whose_parts_are_gone_says_so_and_how_to_fix_it(gpu_fixtures: Path, tmp_path: Path) -> None:
    res = _parts(gpu_fixtures / CASE, tmp_path / "a")
    victim = sorted((tmp_path / "a" / "parts" / "table=kernels").glob("rank=1/*.parquet"))[0]
    victim.unlink()
    p = run_orch("report", str(res.store))
    assert p.returncode != 0 and p.stdout == ""
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1, p.stderr
    assert f"{victim.relative_to(tmp_path / 'a' / 'parts')} is not there" in lines[0]
    assert "--copy-events" in lines[0] and "orch collect" in lines[0] and "Traceback" not in p.stderr


def test_a_copied_run_reads_its_own_parts_and_a_changed_part_is_refused(stores: Stores, gpu_fixtures: Path,
        tmp_path: Path) -> None:
    ref = stores.store(gpu_fixtures / CASE)
    res = _parts(gpu_fixtures / CASE, tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "copy")
    kernels = tmp_path / "a" / "parts" / "table=kernels"
    (r0,), (r1,) = (sorted(kernels.glob(f"rank={r}/*.parquet")) for r in (0, 1))
    shutil.copy(r1, r0)  # the original's rank 0 mapped again from another report
    assert_same_report(ref, tmp_path / "copy" / "profile.duckdb")
    p = run_orch("report", str(res.store))
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert f"{r0.relative_to(tmp_path / 'a' / 'parts')} changed since the store was made" in p.stderr, p.stderr


def test_copy_events_gives_a_store_that_stands_alone(gpu_fixtures: Path, tmp_path: Path) -> None:
    views = _parts(gpu_fixtures / CASE, tmp_path / "v")
    copied = _parts(gpu_fixtures / CASE, tmp_path / "c", copy_events=True)
    assert views.views and copied.views == [] and table_types(copied.store) == {}
    assert _sums(copied.store) == _sums(views.store)
    alone = tmp_path / "alone.duckdb"
    shutil.copy(copied.store, alone)
    shutil.rmtree(tmp_path / "c")
    assert_same_report(views.store, alone)


def test_aligned_clocks_move_the_viewed_rows(gpu_fixtures: Path, tmp_path: Path) -> None:
    ref = collect([gpu_fixtures / CASE], tmp_path / "ref", layout=Layout(), console=QUIET, align=True)
    res = _parts(gpu_fixtures / CASE, tmp_path / "a", align=True)
    with duckdb.connect(str(res.store), read_only=True) as con:
        corr = dict(con.execute("SELECT rank, clock_correction_ns FROM ranks").fetchall())
    assert "kernels" in res.views and any(corr.values()), corr  # corrected clocks: the check below can fail
    assert_same_store(ref.store, res.store)


def test_only_tables_with_large_files_become_views(stores: Stores, gpu_fixtures: Path,
        tmp_path: Path) -> None:
    """By default a table is a view where its part files hold VIEW_MIN_ROWS rows a rank on
    average, counted here from the in-process store (one file per rank and table), or where no
    report reads it (UNREAD, whatever its size)."""
    ref = stores.store(gpu_fixtures / CASE)
    with duckdb.connect(str(ref), read_only=True) as con:
        per_rank = {t: con.execute(f"SELECT count(*) / count(DISTINCT rank) FROM {t}").fetchone()[0] for t in VIEWABLE}
    want = [t for t in VIEWABLE if (per_rank[t] or 0) >= VIEW_MIN_ROWS or (t in UNREAD and per_rank[t])]
    some = min(n for t, n in per_rank.items() if n and t not in UNREAD)
    assert 0 < len(want) < len([n for n in per_rank.values() if n]), per_rank  # the rule splits this job
    assert collect_parts([gpu_fixtures / CASE], tmp_path / "a", layout=Layout(), console=QUIET).views == want
    assert _parts(gpu_fixtures / CASE, tmp_path / "b", view_min_rows=int(some) + 1).views == [
        t for t in VIEWABLE if (per_rank[t] or 0) >= some + 1 or (t in UNREAD and per_rank[t])]


def test_a_run_path_with_glob_characters_reads_its_own_parts(stores: Stores, gpu_fixtures: Path,
        tmp_path: Path) -> None:
    """DuckDB's readers take `*` and `[` in a path as a pattern: `run*` would also read the parts
    of `runA` beside it, `run[A]` those of `runA` instead of its own."""
    ref = stores.store(gpu_fixtures / CASE)
    _parts(gpu_fixtures / CASE, tmp_path / "runA")  # the decoy both patterns match
    for name in ("run*", "run[A]"):
        res = _parts(gpu_fixtures / CASE, tmp_path / name)
        assert res.views and res.engine == "parts"
        assert_same_store(ref, res.store)
        assert_same_report(ref, res.store)


def test_tables_no_report_reads_stay_in_the_parts(stores: Stores, gpu_fixtures: Path,
        tmp_path: Path) -> None:
    """views.UNREAD stays in the parts whatever its size, and no report reads it: with its parts
    spoiled (the sizes kept, so the store still opens), `orch report` (terminal, JSON, HTML) and
    `orch export-trace` give what they give over the in-process store; a query of it fails."""
    ref = stores.store(gpu_fixtures / CASE)
    res = collect_parts([gpu_fixtures / CASE], tmp_path / "a", layout=Layout(), console=QUIET, summaries=True)
    assert [t for t in UNREAD if _has_rows(ref, t)] == list(UNREAD)  # the check below can fail
    assert set(UNREAD) <= set(res.views)
    for t in UNREAD:
        for f in (tmp_path / "a" / "parts").glob(f"table={t}/*/*.parquet"):
            f.write_bytes(b"\0" * f.stat().st_size)
    with duckdb.connect(str(res.store), read_only=True) as con, pytest.raises(duckdb.Error):
        con.execute(f"SELECT count(*) FROM {UNREAD[0]}").fetchall()
    out = {}
    for name, store in (("ref", ref), ("a", res.store)):
        d = tmp_path / f"out-{name}"
        d.mkdir()
        r = run_orch("report", str(store), "--json", str(d / "r.json"), "--html", str(d / "r.html"))
        assert r.returncode == 0, r.stderr
        t = run_orch("export-trace", str(store), "-o", str(d / "t.json"))
        assert t.returncode == 0, t.stderr
        report = json.loads((d / "r.json").read_text())
        report.pop("store")
        events = json.loads((d / "t.json").read_text())["traceEvents"]  # (in the order the rows came)
        out[name] = (report, sorted(json.dumps(e, sort_keys=True) for e in events))
    assert out["a"] == out["ref"]


def test_a_report_of_mapped_ranks_reads_no_event_table(stores: Stores, gpu_fixtures: Path,
        tmp_path: Path) -> None:
    """Where every rank's map computed its statistics, the report's analysis is the reduce of
    them alone: with every part of the event tables that stay in the parts (the CUDA calls,
    kernels, copies, memsets, OS-runtime calls, threads, syncs) emptied (the same columns, no
    rows; the store's record of their sizes updated, so it still opens them), the report is the
    in-process store's. (The HTML timeline and `export-trace` draw the events of a few ranks:
    they read them by design.)"""
    ref = stores.store(gpu_fixtures / CASE)
    res = _parts(gpu_fixtures / CASE, tmp_path / "a", summaries=True)
    events = [t for t in (*IF_MAPPED, "kernels", *UNREAD) if t in TABLES and _has_rows(ref, t)]
    assert {"cuda_api", "kernels", "osrt", "threads"} <= set(events) <= set(res.views)  # the check can fail
    parts = tmp_path / "a" / "parts"
    with duckdb.connect(str(res.store)) as con:
        for t in events:
            for f in parts.glob(f"table={t}/*/*.parquet"):
                con.execute(f"COPY (SELECT * FROM read_parquet('{f}') LIMIT 0) TO '{f}' (FORMAT parquet)")
                con.execute("UPDATE event_parts SET bytes = ? WHERE path = ?",
                            [f.stat().st_size, str(f.relative_to(parts))])
        assert con.execute("SELECT count(*) FROM kernels").fetchone() == (0,)
    assert_same_report(ref, res.store)


def test_views_take_the_store_rank_where_the_folder_says_another(gpu_fixtures: Path, tmp_path: Path) -> None:
    """A part holds the rank its map knew, which its folder names; a view takes it from there
    only where that is the store's rank for every part (views.own_ranks), else from
    event_parts: with the store's ranks swapped, the views' rows swap ranks with them."""
    res = _parts(gpu_fixtures / CASE, tmp_path / "a", summaries=True)
    tables = {t: c for t, c in (("kernels", "start"), ("map_compute_islands", "s")) if t in res.views}
    assert len(tables) == 2, res.views
    root = tmp_path / "a" / "parts"
    with duckdb.connect(str(res.store)) as con:
        before = {t: dict(con.execute(f"SELECT rank, sum({c}) FROM {t} GROUP BY rank").fetchall())
                  for t, c in tables.items()}
        assert all(len(b) == 2 and len(set(b.values())) == 2 for b in before.values()), before  # swaps show
        con.execute("UPDATE event_parts SET rank = 1 - rank")
        create_views(con, root, tables)
        after = {t: dict(con.execute(f"SELECT rank, sum({c}) FROM {t} GROUP BY rank").fetchall())
                 for t, c in tables.items()}
    assert after == {t: {1 - r: n for r, n in b.items()} for t, b in before.items()}
    assert "p.rank AS rank" in view_sql("kernels", root, ["table=kernels/rank=1/x.parquet"], ranks=[1])
    assert "m.rank AS rank" in view_sql("kernels", root, ["table=kernels/rank=-1/x.parquet"], ranks=[0])


def test_a_part_listed_by_its_absolute_path_is_read_where_it_is(tmp_path: Path) -> None:
    """Part paths are joined to the parts folder as text; one given absolute stays as it is,
    as Path joins it (it is not looked for under the folder)."""
    root, elsewhere = tmp_path / "parts", tmp_path / "elsewhere"
    con = duckdb.connect()
    for base, rank in ((root, 0), (elsewhere, 1)):
        folder = base / "table=t" / f"rank={rank}"
        folder.mkdir(parents=True)
        con.execute(f"COPY (SELECT {10 * rank + 7} AS v) TO {file_literal(folder / 'p.parquet')} (FORMAT parquet)")
    rows = parts_select("t", [("rank", "INTEGER"), ("v", "BIGINT")], (), root,
                        ["table=t/rank=0/p.parquet", str(elsewhere / "table=t" / "rank=1" / "p.parquet")],
                        own_rank=True)
    assert con.execute(f"SELECT rank, v FROM ({rows}) ORDER BY rank").fetchall() == [(0, 7), (1, 17)]
