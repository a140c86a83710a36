"""The analysis SQL run concurrently (metrics/sqlrun.py): the dependencies it takes from the
files' declared headers, and the same tables as a plain run of every unit in order, on a real capture."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import duckdb
import pytest

from orchestrator.collect.collect import collect, collecting
from orchestrator.layout import Layout
from orchestrator.metrics import sqlrun
from orchestrator.metrics.engine import (
    Options,
    _plan,
    analysis,
    analysis_threads,
    attach_store,
    on_writer,
    prepare,
    session,
    store_rows,
)
from orchestrator.sqlmodules import SQL_DIR

pytestmark = pytest.mark.fast

REAL = Path(__file__).parent / "fixtures" / "real"


def _head(reads: str, provides: str, writes: str = "") -> str:
    return (f"-- Reads: {reads}.\n" + (f"-- Writes: {writes}.\n" if writes else "")
            + "-- Provides:\n" + "".join(f"--   {p}\n" for p in provides.split()))


def test_dependencies_from_the_declared_headers() -> None:
    files = [
        ("a.sql", _head("nothing", "t(x)")),
        ("b.sql", _head("nothing", "u(x)")),
        ("c.sql", _head("t", "v(x)")),  # a view over t
        ("d.sql", _head("nothing", "m(tbl)")),
        ("e.sql", _head("t", "e1(x)", writes="t")),  # adds rows to t: after its provider and its reader c
        ("f.sql", _head("v, m, u", "f1(x)")),
        ("g.sql", _head("v", "g1(x)", writes="u")),  # f reads u: first
        ("h.sql", _head("nothing", "h1(x)", writes="t")),  # f and g read t through v: first
    ]
    after = {u.name: set(u.after) for u in sqlrun.plan(files)}
    assert after == {"a.sql": set(), "b.sql": set(), "c.sql": {"a.sql"}, "d.sql": set(),
                     "e.sql": {"a.sql", "c.sql"}, "f.sql": {"b.sql", "c.sql", "d.sql"},
                     "g.sql": {"b.sql", "c.sql", "f.sql"},
                     "h.sql": {"a.sql", "c.sql", "e.sql", "f.sql", "g.sql"}}


def _rows(con: duckdb.DuckDBPyConnection, table: str) -> list[tuple]:
    """A table's rows (`schema.name`), sorted, floats rounded (parallel sums may differ in the last bits)."""
    typed = con.execute(f"SELECT column_name, column_type FROM (DESCRIBE memory.{table})").fetchall()
    sel = ", ".join(f'round("{c}", 6)' if t in ("DOUBLE", "FLOAT") else f'"{c}"' for c, t in typed)
    return sorted(con.execute(f"SELECT {sel} FROM memory.{table}").fetchall(), key=repr)


def test_concurrent_run_equals_the_files_in_order(tmp_path: Path) -> None:
    """Every analysis table after the concurrent run equals a plain in-order run of every unit
    on one connection, each on its own search path (a missing dependency fails with 'does not
    exist' or, for a file that adds rows to another's table, gives a different table)."""
    inp = tmp_path / "in"
    inp.mkdir()
    for f in sorted(REAL.glob("resnet_nw2_r*_*.sqlite.gz")):
        shutil.copy(f, inp / f.name)
    store = collect([inp], tmp_path / "run", layout=Layout(), workers=2).store
    con, _ = analysis(store, Options())
    ref = attach_store(store)
    try:
        prepare(ref, Options())
        units = _plan()
        assert [u.name for u in units if u.sql] == sorted(p.name for p in SQL_DIR.iterdir() if p.name.endswith(".sql"))
        for u in units:
            sqlrun.execute(ref, u, session)
        tables = ("SELECT schema_name || '.' || table_name FROM duckdb_tables() WHERE database_name = 'memory' "
                  "ORDER BY 1")
        names = [r[0] for r in ref.execute(tables).fetchall()]
        assert len(names) > 50
        got = [r[0] for r in con.execute(tables).fetchall()]
        assert got == names
        for n in names:
            assert _rows(con, n) == _rows(ref, n), n
    finally:
        con.close()
        ref.close()


def test_a_failed_file_stops_the_files_after_it() -> None:
    con = duckdb.connect()
    units = sqlrun.plan([
        ("a.sql", _head("nothing", "a(x)") + "CREATE TABLE a AS SELECT 1 AS x;"),
        ("b.sql", _head("no_such_table", "b(x)") + "CREATE TABLE b AS SELECT * FROM no_such_table;"),
        ("c.sql", _head("b", "c(x)") + "CREATE TABLE c AS SELECT * FROM b;"),
        ("d.sql", _head("c", "d(x)") + "CREATE TABLE d AS SELECT * FROM c;"),
    ])
    try:
        sqlrun.run(con, units, lambda cur: None, n_workers=2)
    except duckdb.CatalogException as e:
        assert "no_such_table" in str(e)  # the first failure, not a dependent's
        assert sqlrun.failed_file(e) == "b.sql"
    else:
        raise AssertionError("the failed file was not reported")
    made = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
    assert made == {"a"}


def test_threads_follow_the_store_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DuckDB threads for the analysis come from the store's rows (DuckDB's catalog, no scan),
    the same for `orch report` (the file) and `orch analyze` (the collect's connection): the
    catalog's count equals the rows counted table by table. (Uncapped: the suite's workers cap
    their threads, tests/conftest.py.)"""
    monkeypatch.delenv("ORCH_DUCKDB_THREADS", raising=False)
    inp = tmp_path / "in"
    inp.mkdir()
    for f in sorted(REAL.glob("resnet_nw2_r*_*.sqlite.gz")):
        shutil.copy(f, inp / f.name)
    with collecting([inp], tmp_path / "run", layout=Layout(), workers=2) as (res, writer):
        cur = on_writer(writer)
        on_writer_threads = cur.execute("SELECT current_setting('threads')").fetchone()[0]
        cur.close()
    con = attach_store(res.store)
    try:
        tables = [r[0] for r in con.execute(
            "SELECT table_name FROM duckdb_tables() WHERE database_name = 'store'").fetchall()]
        counted = sum(con.execute(f'SELECT count(*) FROM store."{t}"').fetchone()[0] for t in tables)
        assert counted > 50_000 and store_rows(con) == counted
        threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
        assert threads == on_writer_threads == analysis_threads(counted)
    finally:
        con.close()
    # one thread per 100k rows, at least 4, at most the cores
    assert [analysis_threads(n, 16) for n in (90_000, 815_000, 1_250_000, 3_300_000)] == [4, 8, 12, 16]
    assert analysis_threads(3_300_000, 2) == 2 and analysis_threads(0, 1) == 1


def _cursors_of(n_files: int, big_rows: int, tmp_path: Path) -> list[int]:
    """How many of `n_files` independent files each cursor ran, most first, after a first file
    that makes a table of `big_rows` rows, on a connection capped at 32 MB that spills to
    `tmp_path`, on 2 workers."""
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '32MB'; SET temp_directory = '{tmp_path}'; SET threads = 1")
    files = [("a.sql", _head("nothing", "a(s)")
              + f"CREATE TABLE a AS SELECT repeat('x', 64) || range AS s FROM range({big_rows});")]
    files += [(f"b{i}.sql", _head("a", f"b{i}(c)") + f"CREATE TABLE b{i} AS SELECT current_connection_id() AS c "
               "FROM (SELECT count(*) FROM range(2000000) WHERE range % 7 = 3);") for i in range(n_files)]
    try:
        sqlrun.run(con, sqlrun.plan(files), lambda cur: None, n_workers=2)
        assert con.execute(sqlrun._SPILLED).fetchone()[0] == (big_rows > 100_000)
        by = Counter(con.execute(f"SELECT c FROM b{i}").fetchone()[0] for i in range(n_files))
        return sorted(by.values(), reverse=True)
    finally:
        con.close()


def test_once_duckdb_spills_the_files_left_run_on_one_cursor(tmp_path: Path) -> None:
    """Past DuckDB's memory cap (the first file's table spills), the files taken after it run
    on one cursor, one after the other (two cursors hold more memory: sqlrun's docstring); the
    second worker runs at most the one file it took before. While the tables fit, both take
    files."""
    ran = _cursors_of(12, 2_000_000, tmp_path / "spill")
    assert sum(ran) == 12 and ran[0] >= 11, ran
    ran = _cursors_of(12, 1_000, tmp_path / "fit")
    assert len(ran) == 2 and ran[1] >= 2, ran
