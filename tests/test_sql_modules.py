"""The SQL modules' headers are declarations, checked against what DuckDB runs on a real store
(tests/sqlcheck.py says how); the rules' `reads` against their code; docs/metrics.md against
the headers. Each check also fails on a drift planted here, so a check that passes is one that
can fail."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import duckdb
import pytest

from orchestrator import sqlmodules
from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import Context, Rule
from orchestrator.collect.collect import collect_parts
from orchestrator.layout import Layout
from orchestrator.metrics import rankpass
from orchestrator.metrics.engine import Options, Views, analysis
from orchestrator.sqlmodules import SQL_DIR, HeaderError, Module
from orchestrator.store.map_tables import SUMMARIES
from tests import sqlcheck

pytestmark = pytest.mark.replay

REPO = Path(__file__).resolve().parent.parent
REAL = Path(__file__).parent / "fixtures" / "real"


def _modules(edit: dict[str, tuple[str, str]] | None = None) -> list[Module]:
    """Every module, with `edit` = {file: (old, new)} applied to copies of their text."""
    files = []
    for f in sorted(p for p in SQL_DIR.iterdir() if p.name.endswith(".sql")):
        sql = f.read_text()
        if edit and f.name in edit:
            old, new = edit[f.name]
            assert old in sql, (f.name, old)
            sql = sql.replace(old, new, 1)
        files.append((f.name, sql))
    return sqlmodules.parse_all(files)


@dataclass
class Checked:
    full: duckdb.DuckDBPyConnection  # a full analysis of a real store
    store: Path
    snap: Path  # its tables and views, as a file the per-module runs attach
    stored: set[str]  # the store's tables


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Checked]:
    d = tmp_path_factory.mktemp("sqlmod")
    (d / "in").mkdir()
    for f in sorted(REAL.glob("resnet_nw2_r*_*.sqlite.gz")):
        shutil.copy(f, d / "in" / f.name)
    # Over parts with the map's summaries: the store then has every table the SQL may read.
    store = collect_parts([d / "in"], d / "run", layout=Layout(), workers=2, summaries=True).store
    full, _ = analysis(store, Options())
    sqlcheck.materialize(full, d / "snap.duckdb")
    stored = {r[0] for r in full.execute("SELECT table_name FROM information_schema.tables "
                                            "WHERE table_catalog = 'store'"
                                         ).fetchall()}
    yield Checked(full, store, d / "snap.duckdb", stored)
    full.close()


def _drift(c: Checked, modules: list[Module], only: set[str] | None = None) -> list[str]:
    """Every drift of the headers; `only`: run those files only (the others are checked above)."""
    out = sqlcheck.declaration_problems(modules, c.stored)
    for m in modules:
        if only is None or m.file in only:
            out += sqlcheck.run_declared(m, modules, c.full, c.store, c.snap)
    return out


def test_every_module_declares_what_it_reads_and_provides(checked: Checked) -> None:
    assert _drift(checked, _modules()) == []


def test_every_rule_reads_what_it_declares() -> None:
    modules = _modules()
    assert sqlcheck.rule_problems({p.name for m in modules for p in m.public}) == []


def test_the_report_reads_only_public_views(checked: Checked) -> None:
    """The Python that shapes the report (analyze/*.py) reads only what a module provides
    publicly, or the store: a private helper renamed or dropped by its file breaks no reader.
    Only literal names are followed (tables.py builds some of its queries)."""
    public = {p.name for m in _modules() for p in m.public}
    wrong = {}
    for f in sorted((REPO / "orchestrator" / "analyze").glob("*.py")):
        found, _ = sqlcheck.reads_in(ast.parse(f.read_text()), {}, f.name)
        if found - public - checked.stored:
            wrong[f.name] = sorted(found - public - checked.stored)
    assert wrong == {}


@pytest.mark.parametrize(("edit", "expected"), [
    ({"55_sync_steps.sql": (", gap_attr,", ",")}, "55_sync_steps.sql reads gap_attr without declaring it"),
    ({"40_gaps.sql": ("small_gaps(rank INTEGER, n BIGINT, ns BIGINT)", "small_gaps(rank INTEGER, n BIGINT, "
                                                                       "total_ns BIGINT)")},
     "40_gaps.sql: small_gaps(rank, n, total_ns) is really small_gaps(rank, n, ns)"),
    ({"90_gpu_work.sql": ("\nCREATE", "\nCREATE TABLE undeclared AS SELECT 1 AS x;\nCREATE")},
     "90_gpu_work.sql creates undeclared, which its header does not provide"),
    ({"40_gaps.sql": ("-- Reads: islands,", "-- Reads: _clipped, islands,")},
     "40_gaps.sql reads _clipped: a private name"),
    ({"90_gpu_work.sql": ("-- Reads: memcpy,", "-- Reads: sync_copies, memcpy,")},
     "90_gpu_work.sql reads sync_copies: no store table, `params` or earlier module provides it"),
    ({"90_gpu_work.sql": ("kernel_stats(rank", "win(rank")},
     "90_gpu_work.sql provides win, which 20_window.sql provides already"),
])
def test_checker_fails_on_planted_drift(checked: Checked, edit: dict, expected: str) -> None:
    got = _drift(checked, _modules(edit), set(edit))
    assert any(expected in p for p in got), got


class _Planted(Rule):
    kind: ClassVar[str] = "planted"
    reads: ClassVar[tuple[str, ...]] = ("kernel_stats", "small_gaps")

    def evaluate(self, ctx: Context) -> list[Finding]:
        ctx.views.rows("gap_cpu")
        ctx.views.by_rank("kernel_stats")
        ctx.views.rows("_clipped")
        return []


def test_rule_checker_fails_on_planted_drift() -> None:
    modules = _modules()
    got = sqlcheck.rule_problems({p.name for m in modules for p in m.public}, [_Planted()])
    name = Path(__file__).name
    assert sorted(got) == sorted([
        f"rules/{name} reads _clipped, which no SQL module provides",
        f"rules/{name} reads _clipped without listing it in `reads`",
        f"rules/{name} reads gap_cpu without listing it in `reads`",
        f"rules/{name} lists small_gaps in `reads` but never reads it",
    ])


def test_a_rule_reads_only_its_declared_views() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE kernel_stats AS SELECT 0 AS rank; CREATE TABLE gap_cpu AS SELECT 0 AS rank")
    ctx = Context(views=Views(con), report=None, opts=Options())  # type: ignore[arg-type]
    scoped = ctx.for_rule(_Planted())
    assert scoped.views.by_rank("kernel_stats") == {0: {"rank": 0}}
    with pytest.raises(LookupError, match="gap_cpu"):
        _Planted().evaluate(scoped)


def test_sql_tables_from_duckdbs_parser() -> None:
    assert sqlcheck.sql_tables("WITH t AS (SELECT * FROM a) SELECT * FROM t JOIN b USING (x) "
                               "WHERE x IN (SELECT x FROM c)") == {"a", "b", "c"}


def test_header_parse() -> None:
    m = sqlmodules.parse("x.sql", "-- What it is.\n-- Reads: a, b (a note, with a comma.), c.\n-- Writes: a.\n"
                         "-- Provides:\n--   t(x, y)  doc\n--       more doc\n--   _h(z)\n-- Notes.\nSELECT 1;")
    assert (m.reads, m.writes) == (("a", "b", "c"), ("a",))
    assert [(p.name, p.columns, p.doc, p.private) for p in m.provides] == [
        ("t", ("x", "y"), "doc more doc", False), ("_h", ("z",), "", True)]
    for bad in ("-- Provides:\n--   t(x)\n",  # no Reads
                "-- Reads: a.\n",  # no Provides
                "-- Reads: a.\n-- Provides:\n--   t  doc\n",  # no columns
                "-- Reads: a.\n-- Provides:\n--   t(x, y (note))\n",
                "-- Reads: a.\n-- Provides:\n--   t(rank INTEGER, n)\n",  # a type for some columns only
                "-- Reads: a.\n-- Provides:\n--   t(rank INT)\n"):  # not one of the map's types
        with pytest.raises(HeaderError):
            sqlmodules.parse("x.sql", bad + "SELECT 1;")
    typed = sqlmodules.parse("x.sql", "-- Reads: a.\n-- Provides:\n--   t(rank INTEGER, n BIGINT)  doc\nSELECT 1;")
    assert [(p.columns, p.types) for p in typed.provides] == [(("rank", "n"), ("INTEGER", "BIGINT"))]


def test_typed_header_entries_are_the_map_tables() -> None:
    """A header gives its columns types where the map writes the table (store/map_tables.py reads
    them from there, the one declaration of the map's columns), and otherwise only in a per-rank
    file, for the empty table it leaves where no rank is left to it (rankpass.py)."""
    files = [sqlmodules.parse(f.name, f.read_text()) for f in sorted(SQL_DIR.iterdir()) if f.name.endswith(".sql")]
    typed = {p.name: m.per_rank for m in files for p in m.provides if p.types}
    mapped = {s.source for s in SUMMARIES}
    assert mapped <= set(typed)
    assert {name for name, key in typed.items() if name not in mapped and not key} == set()
    assert {s.table: s.columns for s in SUMMARIES}["map_steps"] == (
        ("rank", "INTEGER"), ("tid", "BIGINT"), ("start", "BIGINT"), ("end", "BIGINT"), ("step", "INTEGER"),
        ("family", "INTEGER"))


def test_a_per_rank_files_views_read_only_its_pass() -> None:
    """A per-rank file's views read only what its key's per-rank files make (metrics/rankpass.py):
    a view binds its names where it is read, so one over an input would read every rank's rows
    from the files after the pass. A header's `Map:` line is a key or nothing."""
    modules = _modules()
    for m in (m for m in modules if m.per_rank):
        own = {p.name for x in modules if x.per_rank == m.per_rank for p in x.provides}
        for st in duckdb.extract_statements(m.sql):
            view = re.match(r"\s*CREATE OR REPLACE VIEW (\w+) AS (.*)", sqlmodules.code(st.query), re.S)
            if view:
                assert sqlcheck.sql_tables(view.group(2)) <= own, (m.file, view.group(1))
    with pytest.raises(HeaderError, match="Map: per rank"):
        _modules({"90_gpu_work.sql": ("-- Map: per rank", "-- Map: per rank, mapped")})
    with pytest.raises(HeaderError, match="the key is one of"):
        rankpass.plan(_modules({"90_gpu_work.sql": ("-- Map: per rank", "-- Map: per rank (map_scope)")}))


def test_no_file_across_ranks_reads_half_a_per_rank_table() -> None:
    """A per-rank file's own tables hold the ranks its pass maps alone (after a job whose ranks
    were all mapped, none): a file across ranks that read one would see no rank the map covered.
    It reads what the map writes, taken whole, instead."""
    assert rankpass.plan(_modules())
    with pytest.raises(HeaderError, match=r"61_replay\.sql reads gpu_ops, which 14_gpu_ops\.sql makes for the "
                       r"ranks of its per-rank pass alone"):
        rankpass.plan(_modules({"61_replay.sql": ("-- Reads: coll, p2p_match, step_ops,",
                                                  "-- Reads: coll, p2p_match, gpu_ops, step_ops,")}))


def test_metrics_doc_is_up_to_date() -> None:
    p = subprocess.run([sys.executable, "scripts/gen_metrics_doc.py", "--check"], cwd=REPO,
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_map_tables_declare_what_the_analysis_makes(checked: Checked) -> None:
    """Each map_* table (store/map_tables.py) has the columns of the analysis table it holds,
    in order: a column added there and not here would be NULL for every mapped rank."""
    for s in SUMMARIES:
        got = [r[0] for r in checked.full.execute(f"DESCRIBE SELECT * FROM {s.source}").fetchall()]
        assert got == [c for c, _ in s.columns], s.table
        assert checked.full.execute(f"SELECT count(*) FROM store.{s.table}").fetchone()[0] > 0 or s.table in (
            "map_sync_copies", "map_graph_usage", "map_graph_eager", "map_gap_python", "map_alloc_gaps"), s.table
        # this capture has no synchronous copies, no CUDA graph (tests/test_graph_shapes.py maps a loop that
        # records them anew), no Python samples (tests/test_loop_marks.py has them) and no GPU gap that device
        # allocations fill (tests/test_gpu_memory.py's empty_cache loop has them)


WHOLE_WINDOW = re.compile(r"\b(\w+)\s*\([^()]*\)\s*OVER\s*\(\s*\)", re.IGNORECASE)


def whole_table_windows(sql: str) -> list[str]:
    """Aggregates over a window of the whole input (`f(x) OVER ()`), other than row_number().
    DuckDB 1.5.5's parallel window source can fail on them with an internal error that depends
    on its threads' timing: the analysis takes such totals from an aggregate joined back
    instead (docs/sql_modules.md, "Whole-table windows")."""
    return [m.group(0) for m in WHOLE_WINDOW.finditer(sql) if m.group(1).lower() != "row_number"]


def test_no_whole_table_window_aggregates() -> None:
    found = {f.name: whole_table_windows(f.read_text()) for f in SQL_DIR.iterdir() if f.name.endswith(".sql")}
    assert {k: v for k, v in found.items() if v} == {}
    assert whole_table_windows("SELECT ns / sum(ns) OVER () FROM t, row_number() OVER () AS i") == ["sum(ns) OVER ()"]


def test_sql_code_leaves_out_comments_and_layout_only() -> None:
    """The map's digest hashes sqlmodules.code: every analysis file reads the same without its
    comment lines and with its layout changed, and differently with a literal or a name changed
    (a space inside a string is the string's own)."""
    for f in sorted(SQL_DIR.glob("*.sql")):
        sql = f.read_text()
        bare = "\n".join("   " + line for line in sql.splitlines() if not line.lstrip().startswith("--"))
        assert sqlmodules.code(sql) == sqlmodules.code(bare), f.name
    one = "SELECT 'memcpy ' || kind AS \"a b\", 'it''s -- kept' FROM t -- gone\nWHERE x>1 /* gone */;"
    assert sqlmodules.code(one) == "SELECT 'memcpy ' || kind AS \"a b\" , 'it''s -- kept' FROM t WHERE x > 1 ;"
    for other in (one.replace("'memcpy '", "'memcpy'"), one.replace('"a b"', '"a  b"'), one.replace("x>1", "x>2")):
        assert sqlmodules.code(other) != sqlmodules.code(one)


def test_private_helpers_are_dropped_and_every_public_view_still_reads(checked: Checked) -> None:
    """A file's private tables and views that its public views and macros do not read are gone
    once the analysis ran (sqlmodules.disposable): no helper holds memory for the rest of the
    report. Every public view binds after it, so none read a dropped helper."""
    modules = _modules()
    dropped = {name for m in modules for _, name in sqlmodules.disposable(m)}
    assert {"_thread_calls", "_clipped", "_rp_run"} <= dropped
    assert "_rp_steps" not in dropped  # the replay's public views read it
    left = {r[0] for r in checked.full.execute("SELECT table_name FROM information_schema.tables "
                                              "WHERE table_catalog = 'memory'").fetchall()}
    assert left & dropped == set()
    views = {r[0] for r in checked.full.execute("SELECT table_name FROM information_schema.tables "
                                               "WHERE table_catalog = 'memory' AND table_type = 'VIEW'").fetchall()}
    public = {p.name for m in modules for p in m.public}
    for v in sorted(views & public):
        checked.full.execute(f'SELECT * FROM "{v}" LIMIT 0')
