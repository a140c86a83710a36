"""The fast ingest path (DuckDB's sqlite scanner, OS runtime calls filtered inside SQLite via
`sqlite_query`) against the plain path (every SELECT run by SQLite itself, rows carried by
Arrow): both must build the same store, row for row, on every real export we have."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from pathlib import Path

import duckdb
import pytest

from orchestrator.collect.collect import collect
from orchestrator.collect.identity import Layout
from orchestrator.store.tables import OSRT_MIN_NS
from tests.conftest import REPO, h200_fixtures

pytestmark = pytest.mark.replay

# Columns that legitimately differ between two stores of the same data.
_VARY = {"meta": "key NOT IN ('created_at', 'engine')"}


def _all_real(dest: Path) -> Path:
    """Every real H200 export (shared fixtures and tests/fixtures/gpu_e2e) as ranks 0..N-1 of
    one job: different programs, OSRT tables from 85 to 845k rows, with and without GPU metrics."""
    files = [*sorted(h200_fixtures().rglob("*.sqlite.gz")),
             *sorted((REPO / "tests" / "fixtures" / "gpu_e2e").glob("*.sqlite.gz"))]
    dest.mkdir()
    for r, f in enumerate(files):
        with gzip.open(f, "rb") as fi, open(dest / f"real_1_r{r}_h{r}.{100 + r}.sqlite", "wb") as fo:
            shutil.copyfileobj(fi, fo)
    return dest


def _rows(store: Path) -> dict[str, list[tuple]]:
    con = duckdb.connect(str(store), read_only=True)
    tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables ORDER BY 1").fetchall()]
    out = {}
    for t in tables:
        where = f" WHERE {_VARY[t]}" if t in _VARY else ""
        cols = [r[0] for r in con.execute(f"DESCRIBE {t}").fetchall() if r[0] not in ("source_file", "file")]
        out[t] = con.execute(f"SELECT {', '.join(chr(34) + c + chr(34) for c in cols)} FROM {t}{where} "
                             "ORDER BY ALL").fetchall()
    con.close()
    return out


def test_scanner_and_sqlite3_stores_identical_on_all_real_exports(tmp_path: Path) -> None:
    src = _all_real(tmp_path / "src")
    a = collect([src], tmp_path / "a", layout=Layout(), engine="scanner", workers=2)
    b = collect([src], tmp_path / "b", layout=Layout(), engine="sqlite3", workers=2)
    assert a.engine == "scanner" and b.engine == "sqlite3"
    assert a.ok_ranks == b.ok_ranks == list(range(len(list(src.glob("*.sqlite")))))
    ra, rb = _rows(a.store), _rows(b.store)
    assert ra.keys() == rb.keys()
    for t in ra:
        assert ra[t] == rb[t], t
    # and osrt holds exactly the calls SQLite itself selects
    want = sum(sqlite3.connect(f).execute(f"SELECT count(*) FROM OSRT_API WHERE end - start >= {OSRT_MIN_NS}")
               .fetchone()[0] for f in src.glob("*.sqlite"))
    assert len(ra["osrt"]) == want > 0


def test_pushed_filter_checks_types_of_kept_rows_only(tmp_path: Path) -> None:
    """A non-integer in a KEPT OS runtime call fails that rank in one line, as the scanner's own
    type check did; the same value in a call the filter drops is never looked at."""
    src = _all_real(tmp_path / "src")
    files = sorted(src.glob("*.sqlite"))
    for f in files[2:]:
        f.unlink()
    dropped, kept = files[:2]
    with sqlite3.connect(dropped) as con:
        con.execute("UPDATE OSRT_API SET returnValue = 'x' WHERE rowid IN "
                    f"(SELECT rowid FROM OSRT_API WHERE end - start < {OSRT_MIN_NS} LIMIT 3)")
    with sqlite3.connect(kept) as con:
        con.execute("UPDATE OSRT_API SET returnValue = 'x' WHERE rowid IN "
                    f"(SELECT rowid FROM OSRT_API WHERE end - start >= {OSRT_MIN_NS} LIMIT 1)")
    res = collect([src], tmp_path / "run", layout=Layout(), engine="scanner")
    assert res.ok_ranks == [0], [(m.rank, m.status, m.notes, m.probe.notes) for m in res.members]
    bad = next(m for m in res.members if m.rank != 0)
    assert bad.status == "error" and any("not an integer" in n for n in bad.notes), bad.notes
