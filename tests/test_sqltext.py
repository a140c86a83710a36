"""orchestrator/sqltext.py: values as SQL literals and PREPARE/EXECUTE instead of DuckDB's Python
binding. Checked against DuckDB's own binding of the same values, and that a whole `orch
report`, and the reduce of the parts route, never bind a value the slow way (no pandas/numpy
import: 0.4 s of every report; no failed attempt per list element where pandas is missing)."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from orchestrator.sqltext import attach, detach, execute, literal, set_option

pytestmark = pytest.mark.replay

VALUES = [None, True, False, 0, -1, 2**63 - 1, -(2**63), 1.5, -0.0, 1e300, "", "it's", "a\x00b", "'; DROP TABLE x; --",
          "\\n", "ünïcødé ✓", "?", "$1", [1, 2, 3], ["a'b", None], []]


@pytest.mark.parametrize("v", VALUES, ids=repr)
def test_literal_equals_duckdb_binding(v: object) -> None:
    con = duckdb.connect()
    bound = con.execute("SELECT ?", [v]).fetchone()[0]
    assert con.execute(f"SELECT {literal(v)}").fetchone()[0] == bound
    assert execute(con, "SELECT ?", [v]).fetchone()[0] == bound


def test_execute_keeps_the_statement_shape() -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT * FROM range(5) r(i)")
    q = "SELECT count(*) FROM t WHERE i < ? AND list_contains(?, i)"
    assert execute(con, q, [3, [0, 2, 4]]).fetchone()[0] == 2
    for text in ("1 OR 1=1", "1) OR (1=1"):  # a string is a value, never SQL: a cast error
        with pytest.raises(duckdb.ConversionException):
            execute(con, q, [text, [1]])
    assert execute(con, "SELECT count(*) FROM t WHERE CAST(i AS VARCHAR) = ?", ["1' OR '1'='1"]).fetchone()[0] == 0
    with pytest.raises(TypeError):
        literal(object())



def test_statements_without_parameters_take_paths_and_names_as_they_are(tmp_path: Path) -> None:
    """ATTACH and SET take no parameters: a path with a quote and a space is attached and set
    as it is; an alias or option that is not a plain name is refused before any SQL runs."""
    d = tmp_path / "it's a dir"
    d.mkdir()
    with duckdb.connect(str(d / "x.duckdb")) as w:
        w.execute("CREATE TABLE t AS SELECT 42 AS v")
    con = duckdb.connect()
    attach(con, d / "x.duckdb", "other", read_only=True)
    assert con.execute("SELECT v FROM other.t").fetchone() == (42,)
    with pytest.raises(duckdb.Error, match="read-only"):
        con.execute("CREATE TABLE other.u AS SELECT 1")
    detach(con, "other")
    detach(con, "other")  # IF EXISTS: a second detach is no error
    set_option(con, "temp_directory", str(d / "spill"))
    assert con.execute("SELECT current_setting('temp_directory')").fetchone()[0] == str(d / "spill")
    set_option(con, "threads", 3)
    assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 3
    for bad in ("x; DROP TABLE t", "a b", ""):
        with pytest.raises(ValueError):
            attach(con, d / "x.duckdb", bad)
        with pytest.raises(ValueError):
            set_option(con, bad, 1)


def _exports(tmp_path: Path) -> Path:
    fx = tmp_path / "exports"
    fx.mkdir()
    for gz in sorted((Path(__file__).parent / "fixtures" / "gpu_e2e").glob("ddp_r*.sqlite.gz")):
        with gzip.open(gz, "rb") as fi, open(fx / gz.name.removesuffix(".gz"), "wb") as fo:
            shutil.copyfileobj(fi, fo)
    return fx


def test_api_reads_tables_and_views_by_name_only(tmp_path: Path) -> None:
    """The Python API's table() and view() take a name, never SQL: a name that is not one is a
    KeyError naming it, and the store is untouched."""
    from orchestrator.api import analyze, open_store

    rep = analyze([_exports(tmp_path)], out=tmp_path / "run", steps_from="^step")
    with open_store(rep.store) as st:
        assert st.table("ranks").num_rows == 2
        assert sorted(st.view("rank_metrics", steps_from="^step").column("rank").to_pylist()) == [0, 1]
        for bad in ('ranks"; DROP TABLE ranks; --', "no_such_view"):
            with pytest.raises(KeyError, match=r"no_such_view|DROP"):
                st.view(bad, steps_from="^step")
            with pytest.raises(KeyError):
                st.table(bad)
        assert st.table("ranks").num_rows == 2


# Prepended to the code of a test below: a fresh interpreter that records, in `tried`, every
# attempt to import pandas or numpy (those DuckDB's Python client makes when it binds a value).
_COUNT_IMPORTS = """
import sys, json
tried = []
class Finder:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('pandas', 'numpy'):
            tried.append(name)
        return None
sys.meta_path.insert(0, Finder())
"""


def _counted(code: str) -> dict:
    """What `code`, run after _COUNT_IMPORTS in its own interpreter, printed last (JSON)."""
    out = subprocess.run([sys.executable, "-c", _COUNT_IMPORTS + code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_report_imports_no_pandas(tmp_path: Path) -> None:
    fx = _exports(tmp_path)
    got = _counted(f"""
from orchestrator.api import analyze
rep = analyze([{str(fx)!r}], out={str(tmp_path / 'run')!r})
from orchestrator.analyze.build import build_analysis
from orchestrator.metrics.engine import Options
build_analysis(rep.store, Options(steps_from='^step'))
print(json.dumps({{"modules": {{m: m in sys.modules for m in ('pandas', 'numpy')}}, "tried": tried}}))
""")
    assert got["modules"] == {"pandas": False, "numpy": False}
    assert got["tried"] == []


def test_the_parts_route_binds_no_python_value(tmp_path: Path) -> None:
    """The reduce (its check of the ranks' map statistics) and a report over the parts (the
    viewed tables it locates) pass every value as a literal: DuckDB's Python client, binding a
    value, looks for pandas and numpy first, once per element of a list where pandas is missing
    (a rank list of 2,048 then costs about half a second). Counted as import attempts in this
    process (the maps run in their own), so the test holds with pandas installed or not."""
    fx = _exports(tmp_path)
    got = _counted(f"""
from pathlib import Path
from rich.console import Console
from orchestrator.collect.collect import collect_parts
from orchestrator.analyze.build import build_analysis
from orchestrator.metrics.engine import Options
from orchestrator.layout import Layout
res = collect_parts([Path({str(fx)!r})], Path({str(tmp_path / 'run')!r}), layout=Layout(),
                    console=Console(stderr=True, quiet=True), workers=2, view_min_rows=0, summaries=True)
build_analysis(res.store, Options(steps_from='^step'))
print(json.dumps({{"viewed": res.views, "tried": tried}}))
""")
    assert got["viewed"], "the store reads no table from the parts: the report's relocate is not exercised"
    assert got["tried"] == []
