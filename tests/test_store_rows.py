"""collect/store.append_rows: the store's small tables (ranks, env, sources, meta, the parts'
index) go in through a JSON-lines file read with the table's own types. Checked against DuckDB's
own binding of the same values, row for row."""

from __future__ import annotations

import math

import duckdb
import pytest

from orchestrator.collect.store import append_rows

pytestmark = pytest.mark.fast

COLUMNS = (("s", "VARCHAR"), ("i", "BIGINT"), ("r", "INTEGER"), ("f", "DOUBLE"), ("b", "BOOLEAN"),
           ("l", "VARCHAR[]"))
ROWS = [
    ("", 0, 0, 0.0, False, []),
    ("it's \"quoted\" \\ back", 2**63 - 1, -(2**31), 1e300, True, ["a'b", None]),
    ("a\x00b", -(2**63), 7, -0.0, None, None),
    ("'; DROP TABLE x; --", None, None, 1.5, True, ["ünïcødé ✓"]),
    ("ünïcødé ✓ \n tab\t", 42, 3, None, False, []),
    ("2026-11-28T08:00:00Z", 1, 1, 2.0, True, ["2026-11-28"]),  # no date detection: text stays text
]


def _table(con: duckdb.DuckDBPyConnection, name: str) -> None:
    con.execute(f"CREATE TABLE {name} (" + ", ".join(f"{c} {t}" for c, t in COLUMNS) + ")")


def test_rows_equal_duckdbs_own_binding() -> None:
    con = duckdb.connect()
    _table(con, "mine")
    _table(con, "bound")
    names = tuple(c for c, _ in COLUMNS)
    append_rows(con, "mine", names, ROWS)
    for r in ROWS:
        con.execute("INSERT INTO bound VALUES (?, ?, ?, ?, ?, ?)", list(r))
    mine = con.execute("SELECT * FROM mine").fetchall()
    assert mine == con.execute("SELECT * FROM bound").fetchall()
    assert len(mine) == len(ROWS)


def test_columns_are_matched_by_name_and_the_rest_are_null() -> None:
    con = duckdb.connect()
    _table(con, "t")
    append_rows(con, "t", ("r", "s"), [(5, "x"), (6, "y")])
    assert con.execute("SELECT s, r, i, l FROM t ORDER BY r").fetchall() == [("x", 5, None, None), ("y", 6, None, None)]


def test_undecodable_text_and_non_finite_floats_are_stored_repaired() -> None:
    """A file name in another encoding reaches Python as lone surrogates: stored with U+FFFD."""
    con = duckdb.connect()
    _table(con, "t")
    raw = b"rank0_\xe9.sqlite".decode("utf-8", "surrogateescape")
    append_rows(con, "t", ("s", "f"), [(raw, math.nan), ("x", math.inf)])
    assert con.execute("SELECT s, f FROM t").fetchall() == [("rank0_\ufffd.sqlite", None), ("x", None)]


@pytest.mark.parametrize("n", [0, 1, 5000])
def test_many_rows_all_arrive(n: int) -> None:
    con = duckdb.connect()
    con.execute("CREATE TABLE event_parts (tbl VARCHAR, i BIGINT, path VARCHAR, rank INTEGER, off BIGINT, "
                "bytes BIGINT)")
    rows = [("kernels", k, f"table=kernels/rank={k}/r{k}_n{k // 8}.{1000 + k}.parquet", k, 10**12 + k,
             None if k % 7 == 0 else 4096 + k) for k in range(n)]
    append_rows(con, "event_parts", ("tbl", "i", "path", "rank", "off", "bytes"), rows)
    got = con.execute("SELECT count(*), sum(off), sum(bytes), count(bytes), max(path) FROM event_parts").fetchone()
    assert got == (n, sum(r[4] for r in rows) or None, sum(r[5] for r in rows if r[5] is not None) or None,
                   sum(r[5] is not None for r in rows), max((r[2] for r in rows), default=None))
