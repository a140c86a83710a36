"""`nsys export --tables` asks only for `export_tables()`: the store built from exports that
hold nothing else must equal the store built from the full exports, table by table. Real
H200 exports (nsys 2025.3) with GPU metrics and with NCCL's NVTX JSON payloads; the other
tables are dropped with plain sqlite3, so a table that collect reads but the list lacks
shows up as a difference here (or as a probe error), with no nsys needed.
"""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from pathlib import Path

import duckdb
import pytest

from orchestrator.collect.collect import collect
from orchestrator.layout import Layout
from orchestrator.store.tables import export_tables
from tests.conftest import store_differences

pytestmark = pytest.mark.replay

COMM = Path(__file__).parent / "fixtures" / "comm"


def _copy(src: Path, dest: Path, keep: set[str] | None) -> int:
    """`src` (.sqlite or .sqlite.gz) as dest/<name>.sqlite, with only `keep`'s tables (None: all);
    returns how many tables were dropped."""
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / src.name.removesuffix(".gz")
    with (gzip.open(src, "rb") if src.name.endswith(".gz") else open(src, "rb")) as fi, open(out, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    if keep is None:
        return 0
    con = sqlite3.connect(out)
    drop = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'") if r[0] not in keep]
    for t in drop:
        con.execute(f'DROP TABLE "{t}"')
    con.commit()
    con.close()
    return len(drop)


@pytest.mark.parametrize("case", ["ddp_straggler", "nvlink"])
def test_store_from_only_the_export_tables_is_the_same(case: str, tmp_path: Path) -> None:
    from tests.conftest import h200_fixtures

    files = (sorted(COMM.glob("nvlink_*.sqlite.gz")) if case == "nvlink"
             else sorted((h200_fixtures() / case).glob("*.sqlite.gz")))
    assert len(files) == 2
    dropped = sum(_copy(f, tmp_path / "only", set(export_tables())) for f in files)
    for f in files:
        _copy(f, tmp_path / "full", None)
    assert dropped >= 60  # ~25 tables per export are never read
    full = collect([tmp_path / "full"], tmp_path / "s_full", layout=Layout())
    only = collect([tmp_path / "only"], tmp_path / "s_only", layout=Layout())
    assert full.ok_ranks == only.ok_ranks == [0, 1]
    diff = store_differences(full.store, only.store)
    assert {t: d for t, d in diff.items() if d[1] or d[2]} == {}
    # the data that needs the metadata tables is there: names, GPU metrics or NCCL payloads
    assert diff["kernels"][0] > 0 and diff["threads"][0] > 0
    con = duckdb.connect(str(only.store), read_only=True)
    assert con.execute("SELECT count(*) FROM kernels WHERE name IS NULL").fetchone()[0] == 0
    if case == "nvlink":
        assert con.execute("SELECT count(*) FROM nvtx WHERE payload IS NOT NULL").fetchone()[0] == 2 * 318
    else:
        assert diff["gpu_metrics"][0] > 0
