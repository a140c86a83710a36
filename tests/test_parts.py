"""The map/reduce collect (`--parts`): per-report Parquet parts reduced into the store must
give exactly the in-process store and report, on every real fixture; a corrupt report is
marked while the others are collected; a re-run maps only what is missing or replaced."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import duckdb
import pytest
from rich.console import Console

from orchestrator.analyze.build import build_report, report_from_views
from orchestrator.collect.collect import collect, collect_parts
from orchestrator.errors import OrchError
from orchestrator.layout import Layout
from orchestrator.metrics.engine import Options, analysis
from orchestrator.store.map_tables import STACK, SUMMARIES, stack_columns
from orchestrator.store.schema import EVENT_SCHEMA
from orchestrator.store.tables import TABLES
from orchestrator.store.views import IF_MAPPED, OWN_MAPPED, VIEWABLE
from tests.conftest import REPO, h200_fixtures, run_orch

pytestmark = pytest.mark.replay

QUIET = Console(stderr=True, quiet=True)
FIXTURES = REPO / "tests" / "fixtures"


def _groups() -> list[tuple[str, list[Path]]]:
    """One case per captured job: <set>/<case>_r<N>_*.sqlite.gz of every real fixture set
    (tests/fixtures/{real,gpu_e2e,comm,stats,modern} and the shared H200 captures), and two of the
    4-GPU runs of tests/fixtures/pairs and layouts."""
    out: dict[str, list[Path]] = {}
    sets = [FIXTURES / d for d in ("real", "gpu_e2e", "comm", "stats", "modern")]
    files = [f for d in sets for f in d.glob("*.sqlite.gz")] + list(h200_fixtures().glob("*/*.sqlite.gz"))
    for f in sorted(files):
        out.setdefault(f"{f.parent.name}/{f.name.rsplit('_r', 1)[0]}", []).append(f)
    for run in ("pairs/pp4-slow-loader", "layouts/tp2dp2"):  # 4 GPUs: a 1F1B pipeline x DP, TP x FSDP
        out[run] = sorted((FIXTURES / run / "exports").glob("*.sqlite.gz"))
    return sorted(out.items())


def _layout(case: str) -> Layout:
    """The layout the job's manifest declares (a 4-GPU run of pairs or layouts: a pipeline's stages
    known), else none."""
    manifest = FIXTURES / case / "manifest.json"
    return Layout(**json.loads(manifest.read_text())["layout"]) if manifest.is_file() else Layout()


def mapped_ranks(store: Path, opts: Options, table: str = "map_ranks") -> list[int]:
    """The ranks whose per-rank stats tables the analysis took from the map (map_tables.py); or
    the ranks of another of the analysis' rank lists (`table`)."""
    return rank_lists(store, opts, table)[0]


def rank_lists(store: Path, opts: Options, *tables: str) -> list[list[int]]:
    """`mapped_ranks` of each of the analysis' rank lists `tables`, from one analysis of `store`."""
    return [[r for (r,) in rows] for rows in analysed(store, opts, *(f"SELECT DISTINCT rank FROM {t} ORDER BY rank"
                                                                       for t in tables))]


def analysed(store: Path, opts: Options, *sql: str) -> list[list[tuple]]:
    """The rows each of `sql` reads after one analysis of `store`."""
    con, _ = analysis(store, opts)
    try:
        return [con.execute(q).fetchall() for q in sql]
    finally:
        con.close()


def edit_map_table(parts: Path, rank: int, table: str, change: str) -> None:
    """Rewrite the rows of the map's `table` in `rank`'s stacked part with `change` (the list of
    a SELECT * REPLACE over them; `t` names them), as another map would have written them."""
    s = next(x for x in SUMMARIES if x.table == table)
    f = next((parts / f"table={STACK}" / f"rank={rank}").glob("*.parquet"))
    con = duckdb.connect()
    con.execute(f"CREATE TABLE stack AS FROM '{f}'")
    con.execute(f"CREATE TABLE t AS {s.unstacked('stack')}")
    con.execute(f"CREATE TABLE edited AS SELECT * REPLACE ({change}) FROM t")
    cols = ", ".join(f'"{c}"' for c, _ in stack_columns())
    con.execute(f"""COPY (SELECT {cols} FROM (SELECT * FROM stack WHERE tbl <> '{table}'
                                              UNION ALL BY NAME ({replace(s, source='edited').stacked()})))
                    TO '{f}.new' (FORMAT parquet)""")
    con.close()
    Path(f"{f}.new").replace(f)
    # ... and its meta, which records the size of every part it wrote (parts.is_fresh)
    meta = parts / "reports" / f"{f.stem}.json"
    m = json.loads(meta.read_text())
    m["sizes"][str(f.relative_to(parts))] = f.stat().st_size
    meta.write_text(json.dumps(m))


def _has_rows(store: Path, table: str) -> bool:
    with duckdb.connect(str(store), read_only=True) as con:
        return con.execute(f"SELECT count(*) > 0 FROM {table}").fetchone()[0]


def table_types(store: Path) -> dict[str, str]:
    """The store's event tables that are not plain tables: {name: VIEW} (not the views of the
    maps' stack, which every store of the parts route has)."""
    stacked = [s.table for s in SUMMARIES if not s.own]
    with duckdb.connect(str(store), read_only=True) as con:
        return dict(con.execute("SELECT table_name, table_type FROM information_schema.tables "
                                "WHERE table_type <> 'BASE TABLE' AND NOT list_contains(?, table_name)",
                                [stacked]).fetchall())


def assert_same_store(a: Path, b: Path) -> None:
    """Every table row for row (as multisets: both paths keep each rank's rows together but
    may order ranks differently), and meta except its time and engine; the per-rank tables
    the map computes (map_tables.py, the parts path only) are left to assert_same_report."""
    con = duckdb.connect(str(a), read_only=True)
    con.execute(f"ATTACH '{b}' AS other (READ_ONLY)")
    tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                        "WHERE table_catalog = current_database() ORDER BY 1").fetchall()]
    other = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                       "WHERE table_catalog = 'other' ORDER BY 1").fetchall()]
    # The maps' stack (and its views) and the parts' index: the parts route's own.
    mapped = {s.table for s in SUMMARIES} | {STACK, "event_parts"}
    assert [t for t in tables if t not in mapped] == [t for t in other if t not in mapped]
    for t in (t for t in tables if t not in mapped and t in other):
        if t == "meta":
            continue
        assert con.execute(f"DESCRIBE {t}").fetchall() == con.execute(f"DESCRIBE other.{t}").fetchall(), t
        n = con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
        assert n == con.execute(f"SELECT count(*) FROM other.{t}").fetchone()[0], t
        for x, y in ((t, f"other.{t}"), (f"other.{t}", t)):
            assert con.execute(f"SELECT count(*) FROM (FROM {x} EXCEPT ALL FROM {y})").fetchone()[0] == 0, t
    differ = con.execute("SELECT coalesce(a.key, b.key) FROM meta a FULL JOIN other.meta b ON a.key = b.key "
                         "WHERE a.value IS DISTINCT FROM b.value ORDER BY 1").fetchall()
    assert {k for (k,) in differ} <= {"created_at", "engine", "parts", "event_views", "event_view_rows",
                                      "event_views_filtered",
                                      "parts_from_store"}, differ
    con.close()


def assert_same_report(a: Path, b: Path, opts: Options | None = None) -> None:
    """The same analysis of two stores; the job's outcome is left out: it is read from the run
    directory beside a store (its manifest and the scheduler), not from the store."""
    same_reports(build_report(a, opts or Options()).model_dump(mode="json"),
                 build_report(b, opts or Options()).model_dump(mode="json"))


def same_reports(ra: dict, rb: dict) -> None:
    """assert_same_report of two reports already made (JSON dumps, not changed)."""
    ra, rb = dict(ra), dict(rb)
    assert ra.pop("store") != rb.pop("store")
    ra.pop("outcome")
    rb.pop("outcome")
    assert ra == rb


def lists_and_report(store: Path, opts: Options, *tables: str) -> tuple[list[list[int]], dict]:
    """`rank_lists` of `tables` and the report (a JSON dump), from ONE analysis of `store`: the
    report reads the same views the lists come from."""
    con, v = analysis(store, opts)
    try:
        lists = [[r for (r,) in con.execute(f"SELECT DISTINCT rank FROM {t} ORDER BY rank").fetchall()]
                 for t in tables]
        return lists, report_from_views(v, store, opts).model_dump(mode="json")
    finally:
        con.close()


class References:
    """Each case's in-process store, collected once a module, and its reports by options: the
    side every parts store of the module's tests is compared with. Never written."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.stores: dict[tuple, Path] = {}
        self.reports: dict[tuple, dict] = {}

    def store(self, case: str, **kw: object) -> Path:
        key = (case, tuple(sorted(kw.items())))
        if key not in self.stores:
            src = self.root / f"src{len(self.stores)}"
            src.mkdir()
            for f in dict(_groups())[case]:
                shutil.copy(f, src / f.name)
            self.stores[key] = collect([src], self.root / f"a{len(self.stores)}", layout=Layout(), console=QUIET,
                                       **kw).store
        return self.stores[key]

    def report(self, case: str, opts: Options | None = None, **kw: object) -> dict:
        opts = opts or Options()
        key = (case, opts, tuple(sorted(kw.items())))
        if key not in self.reports:
            self.reports[key] = build_report(self.store(case, **kw), opts).model_dump(mode="json")
        return self.reports[key]


@pytest.fixture(scope="module")
def refs(tmp_path_factory: pytest.TempPathFactory) -> References:
    return References(tmp_path_factory.mktemp("references"))


@pytest.mark.parametrize("case", [name for name, _ in _groups()])
def test_parts_store_and_report_identical_to_in_process(case: str, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for f in dict(_groups())[case]:
        shutil.copy(f, src / f.name)
    a = collect([src], tmp_path / "a", layout=_layout(case), console=QUIET, workers=2)
    # Every viewable table as a view (whatever its size), so that the views meet every fixture.
    b = collect_parts([src], tmp_path / "b", layout=_layout(case), console=QUIET, workers=2, summaries=True,
                      view_min_rows=0)
    assert b.engine == "parts" and b.mapped == len(a.members) and b.reused == 0
    assert b.ok_ranks == a.ok_ranks and b.warnings == a.warnings
    # All mapped: the event tables with rows and the map's own tables that have parts are views.
    assert b.views == [*(t for t in TABLES if t in (*VIEWABLE, *IF_MAPPED) and _has_rows(b.store, t)),
                       *(t for t in OWN_MAPPED if any((tmp_path / "b" / "parts" / f"table={t}").rglob("*.parquet")))]
    assert table_types(b.store) == dict.fromkeys(b.views, "VIEW")
    assert_same_store(a.store, b.store)
    # Every rank's API and thread tables come from its map, and the report is the same.
    # ... and the sets that gate the event reads hold only -1, no report's rank (21_stats_scope.sql)
    lists, report = lists_and_report(b.store, Options(), "map_ranks", "map_todo", "map_none", "ops_todo")
    assert lists == [a.ok_ranks, *[[-1]] * 3]
    same_reports(build_report(a.store, Options()).model_dump(mode="json"), report)
    parts = tmp_path / "b" / "parts"
    for rank in a.ok_ranks:  # the documented layout
        assert any((parts / f"table={t}" / f"rank={rank}").is_dir() for t in EVENT_SCHEMA)
        assert (parts / f"table={STACK}" / f"rank={rank}").is_dir()
    assert len(list((parts / "reports").glob("*.json"))) == len(a.members)
    assert not list(parts.rglob(".*.tmp-*")), "a map left a temporary part behind"


def test_sqlite3_engine_parts_identical(gpu_fixtures: Path, tmp_path: Path) -> None:
    a = collect([gpu_fixtures / "pp_imbalance"], tmp_path / "a", layout=Layout(), engine="sqlite3", console=QUIET)
    b = collect_parts([gpu_fixtures / "pp_imbalance"], tmp_path / "b", layout=Layout(), engine="sqlite3",
                      console=QUIET, view_min_rows=0)
    assert_same_store(a.store, b.store)


def test_corrupt_report_marked_then_fixed_incrementally(gpu_fixtures: Path, tmp_path: Path) -> None:
    """One corrupt export: every other rank is collected and the bad one named; once the file
    is replaced, a re-run maps only it and the store equals the in-process one."""
    src = tmp_path / "src"
    src.mkdir()
    good = {}
    for case in ("ddp_straggler", "pp_imbalance"):
        for i, f in enumerate(sorted((gpu_fixtures / case).glob("*.sqlite"))):
            rank = len(good)
            dest = src / f"job_1_r{rank}_{case}{i}.{100 + rank}.sqlite"
            shutil.copy(f, dest)
            good[rank] = dest
    backup = tmp_path / "r2.sqlite"
    shutil.copy(good[2], backup)
    good[2].write_bytes(good[2].read_bytes()[:50_000])  # truncated mid-file
    run = tmp_path / "run"
    p = run_orch("collect", "--from", str(src), "--out", str(run), "--parts")
    assert p.returncode == 0, p.stderr
    assert "3 rank(s) ok" in p.stdout and "4 report(s) mapped, 0 reused" in p.stdout
    assert "job_1_r2_" in p.stdout and "error" in p.stdout
    con = duckdb.connect(str(run / "profile.duckdb"), read_only=True)
    assert con.execute("SELECT list(status ORDER BY rank) FROM ranks").fetchone()[0] == ["ok", "ok", "error", "ok"]
    assert con.execute("SELECT count(DISTINCT rank) FROM kernels").fetchone()[0] == 3
    con.close()
    metas = sorted((run / "parts" / "reports").glob("*.json"))
    before = {m.name: m.stat().st_mtime_ns for m in metas}

    shutil.copy(backup, good[2])  # replaced (newer than its parts)
    p = run_orch("collect", "--from", str(src), "--out", str(run), "--parts")
    assert p.returncode == 0, p.stderr
    assert "4 rank(s) ok" in p.stdout and "1 report(s) mapped, 3 reused" in p.stdout
    changed = [m.name for m in metas if m.stat().st_mtime_ns != before[m.name]]
    assert len(changed) == 1 and changed[0].startswith("job_1_r2_")
    ref = collect([src], tmp_path / "ref", layout=Layout(), console=QUIET)
    assert_same_store(ref.store, run / "profile.duckdb")


def _parts(case: str, tmp_path: Path, **kw: object) -> Path:
    """`case` collected over parts with the map's summaries (tmp_path/src, tmp_path/b): the store.
    Its in-process twin is the module's (`refs`)."""
    src = tmp_path / "src"
    src.mkdir()
    for f in dict(_groups())[case]:
        shutil.copy(f, src / f.name)
    return collect_parts([src], tmp_path / "b", layout=Layout(), console=QUIET, summaries=True, **kw).store


@pytest.mark.parametrize("opts", [Options(steps=(3, 5)), Options(stats_scope="capture"), Options(gap_ms=2.5)],
                         ids=["steps 3:5", "whole capture", "gap-ms 2.5"])
def test_map_summaries_of_another_scope_are_recomputed(opts: Options, tmp_path: Path, refs: References) -> None:
    """The map measured in the default scope (and attributed gaps from 1 ms); a report in another
    one computes every rank itself, and says the same as the in-process store's."""
    b = _parts("real/ddp_slowrank", tmp_path)
    assert mapped_ranks(b, Options()) == [0, 1]
    # None mapped in that scope; their steps are still the map's, but every op is read again
    # (13_steps_mapped.sql).
    lists, report = lists_and_report(b, opts, "map_ranks", "ops_mapped", "ops_todo")
    assert lists == [[], [], [-1, 0, 1]]
    same_reports(refs.report("real/ddp_slowrank", opts), report)


LAST_STEP_LATER = 'CASE WHEN step = (SELECT max(step) FROM t) THEN "end" + 1 ELSE "end" END AS "end"'


@pytest.mark.parametrize("edits", [[("map_scope", "n_steps + 1 AS n_steps"), ("map_steps", LAST_STEP_LATER)],
                                   [("map_scope", "'0123456789abcdef' AS sql")]],
                         ids=["other steps", "other SQL"])
def test_map_summary_whose_scope_differs_is_recomputed(edits: list[tuple[str, str]], tmp_path: Path,
                                                       refs: References) -> None:
    """A rank whose map counted other steps (as when the job-wide step detection differs from the
    rank's own), or ran another version of the SQL, is computed centrally; the other rank's rows
    are taken."""
    b = _parts("real/ddp_slowrank", tmp_path)
    for table, change in edits:
        edit_map_table(tmp_path / "b" / "parts", 1, table, change)
    b2 = collect_parts([tmp_path / "src"], tmp_path / "b", layout=Layout(), console=QUIET, summaries=True)
    assert b2.reused == 2 and b2.store == b
    lists, report = lists_and_report(b, Options(), "map_ranks")
    assert lists == [[0]]
    # The CUDA calls stay in the parts only where every rank's map ran this SQL (views.IF_MAPPED).
    assert ("cuda_api" in b2.views) == (edits[0][1] == "n_steps + 1 AS n_steps")
    same_reports(refs.report("real/ddp_slowrank"), report)


def test_map_summaries_with_aligned_clocks(tmp_path: Path, refs: References) -> None:
    """--align-clocks moves each rank by its own correction after the offsets: the map's scope
    (on the rank's clock) still matches, and the report is the in-process one."""
    b = _parts("comm/nvlink", tmp_path, align=True)
    con = duckdb.connect(str(b), read_only=True)
    assert con.execute("SELECT count(*) FROM ranks WHERE clock_correction_ns <> 0").fetchone()[0] > 0
    con.close()
    lists, report = lists_and_report(b, Options(), "map_ranks")
    assert lists == [[0, 1]]
    same_reports(refs.report("comm/nvlink", align=True), report)


def test_map_summaries_made_when_asked_and_then_reused(tmp_path: Path) -> None:
    """Parts mapped without statistics are mapped again when they are asked for, then reused."""
    src = tmp_path / "src"
    src.mkdir()
    for f in dict(_groups())["real/healthy"]:
        shutil.copy(f, src / f.name)
    first = collect_parts([src], tmp_path / "b", layout=Layout(), console=QUIET)
    assert first.mapped == 2 and mapped_ranks(first.store, Options()) == []
    again = collect_parts([src], tmp_path / "b", layout=Layout(), console=QUIET, summaries=True)
    assert again.mapped == 2 and mapped_ranks(again.store, Options()) == [0, 1]
    third = collect_parts([src], tmp_path / "b", layout=Layout(), console=QUIET, summaries=True)
    assert third.mapped == 0 and third.reused == 2 and mapped_ranks(third.store, Options()) == [0, 1]


def test_store_with_map_tables_of_another_shape(tmp_path: Path, refs: References) -> None:
    """A store whose map tables another orch wrote (here: map_scope a table without its SQL
    digest) is analysed as if it had none: every rank computed, the same report."""
    b = _parts("real/ddp_slowrank", tmp_path)
    con = duckdb.connect(str(b))
    con.execute("CREATE TABLE old_scope AS SELECT * EXCLUDE (sql) FROM map_scope")
    con.execute("DROP VIEW map_scope")
    con.execute("ALTER TABLE old_scope RENAME TO map_scope")
    con.close()
    lists, report = lists_and_report(b, Options(), "map_ranks")
    assert lists == [[]]
    same_reports(refs.report("real/ddp_slowrank"), report)


def _op_kinds(store: Path) -> tuple[set[tuple], set[tuple]]:
    """(rank, kind, is_comm) of the GPU ops the analysis read from the events, and of the NCCL kernels."""
    ops, comm = analysed(store, Options(), "SELECT DISTINCT rank, kind, is_comm FROM gpu_ops",
                         "SELECT DISTINCT rank, kind, is_comm FROM comm_ops")
    return set(ops), set(comm)


def test_gpu_ops_of_ranks_whose_steps_are_the_maps(tmp_path: Path, refs: References) -> None:
    """Where a rank's steps are its map's, the report takes the map's GPU ops per step, NCCL
    kernels and compute between steps, and reads none of its other ops; a rank whose map found
    other steps (here one step ending 1 ns later) is computed from its events. Either way the
    report is the in-process one."""
    b = _parts("real/ddp_slowrank", tmp_path)
    (ops,), report = lists_and_report(b, Options(), "ops_mapped")
    assert ops == [0, 1]
    assert _op_kinds(b) == (set(), {(0, "kernel", True), (1, "kernel", True)})
    same_reports(refs.report("real/ddp_slowrank"), report)
    edit_map_table(tmp_path / "b" / "parts", 1, "map_steps", LAST_STEP_LATER)
    b2 = collect_parts([tmp_path / "src"], tmp_path / "b", layout=Layout(), console=QUIET, summaries=True)
    assert b2.reused == 2 and b2.store == b
    # (-1, no rank: the set is never empty)
    lists, report = lists_and_report(b, Options(), "ops_mapped", "ops_todo")
    assert lists == [[0], [-1, 1]]
    ops, comm = _op_kinds(b)
    assert {r for r, _, _ in ops} == {1} and (1, "kernel", False) in ops
    assert comm == {(0, "kernel", True), (1, "kernel", True)}
    same_reports(refs.report("real/ddp_slowrank"), report)


def test_gpu_ops_taken_without_the_statistics_stop_the_analysis(tmp_path: Path) -> None:
    """A rank whose GPU ops are its map's is in the report's scope too (13_steps_mapped.sql): the
    per-rank files never need its other ops, which the analysis does not read. A map whose scope
    disagrees with its own steps (here one more step counted: no map writes that) stops the
    analysis with an error instead of statistics without those ops."""
    b = _parts("real/ddp_slowrank", tmp_path)
    edit_map_table(tmp_path / "b" / "parts", 1, "map_scope", "n_steps + 1 AS n_steps")
    collect_parts([tmp_path / "src"], tmp_path / "b", layout=Layout(), console=QUIET, summaries=True)
    with pytest.raises(OrchError, match=r"21_stats_scope\.sql: .*the GPU ops of rank 1 were taken from its map, "
                       r"but not its statistics.*re-run `orch collect`"):
        analysed(b, Options())


def test_map_statistics_that_cannot_be_read_are_left_out(tmp_path: Path, refs: References) -> None:
    """A stacked map part the reduce cannot read (here: its footer overwritten, the size kept, so
    the map is reused) costs the analysis work only: every rank is computed centrally, the store
    says why, the report is the same."""
    b = _parts("real/ddp_slowrank", tmp_path)
    part = next((tmp_path / "b" / "parts" / f"table={STACK}" / "rank=1").glob("*.parquet"))
    part.write_bytes(part.read_bytes()[:-4] + b"XXXX")
    b2 = collect_parts([tmp_path / "src"], tmp_path / "b", layout=Layout(), console=QUIET, summaries=True)
    assert b2.reused == 2 and b2.store == b
    with duckdb.connect(str(b), read_only=True) as con:
        why = con.execute("SELECT value FROM meta WHERE key = 'map_stats'").fetchone()[0]
        assert why.startswith("not used (") and part.name in why, why
        assert all(con.execute(f"SELECT count(*) FROM {s.table}").fetchone()[0] == 0 for s in SUMMARIES)
    lists, report = lists_and_report(b, Options(), "map_ranks")
    assert lists == [[]]
    same_reports(refs.report("real/ddp_slowrank"), report)


@pytest.mark.parametrize("table", ["kernels", "map_compute_islands"])
def test_part_cut_short_is_mapped_again(table: str, tmp_path: Path, refs: References) -> None:
    """A part of another size than the map wrote (a copy cut short) is not reused: its report is
    mapped again, and the report is the in-process one."""
    b = _parts("real/ddp_slowrank", tmp_path)
    part = next((tmp_path / "b" / "parts" / f"table={table}" / "rank=1").glob("*.parquet"))
    part.write_bytes(part.read_bytes()[: part.stat().st_size // 2])
    b2 = collect_parts([tmp_path / "src"], tmp_path / "b", layout=Layout(), console=QUIET, summaries=True)
    assert (b2.mapped, b2.reused) == (1, 1)
    lists, report = lists_and_report(b, Options(), "map_ranks")
    assert lists == [[0, 1]]
    same_reports(refs.report("real/ddp_slowrank"), report)


def test_temp_part_of_a_killed_map_is_removed_when_its_rank_is_mapped_again(tmp_path: Path) -> None:
    """A map killed mid-write leaves its temp part (named with its dead pid) and no meta, so its
    report is mapped again by the next collect, which removes the temp first."""
    _parts("real/ddp_slowrank", tmp_path)
    parts = tmp_path / "b" / "parts"
    meta = sorted((parts / "reports").glob("*.json"))[1]
    final = next((parts / f"table={STACK}" / "rank=1").glob("*.parquet"))
    dead = _dead_pid()
    temp = final.with_name(f".{final.stem}.tmp-{dead}.parquet")
    temp.write_bytes(b"PAR1 half a part")
    meta.unlink()  # the map wrote no meta: its report is not fresh
    b2 = collect_parts([tmp_path / "src"], tmp_path / "b", layout=Layout(), console=QUIET, summaries=True)
    assert (b2.mapped, b2.reused) == (1, 1)
    assert not temp.exists() and final.exists()


def _dead_pid() -> int:
    """The pid of a process that has exited (and was reaped)."""
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid
