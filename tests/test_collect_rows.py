"""The store holds exactly the rows the exports say, whatever the ingest went through: a rank
with impossible rows (end < start) keeps all its other rows and has them counted in a note,
and a rank whose insert fails mid-way (after other ranks of its batch, and its own earlier
tables, were already inserted) leaves no row behind while the rest of its batch is kept.

Expected values are plain sqlite3 over the export files (written from nsys' schema, not
from orch): row counts, the impossible rows per table, and the sum of durations of the kept
rows (a delete of the wrong rows changes it). Run for both engines and the Parquet path."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import duckdb
import pytest
from rich.console import Console

from orchestrator.collect.collect import collect, collect_parts
from orchestrator.layout import Layout
from orchestrator.store.tables import OSRT_MIN_NS
from tests.test_untrusted_collect import plant

pytestmark = pytest.mark.replay

# store table -> (nsys table, the rows of it the store keeps, before impossible ones go)
SOURCES = {
    "kernels": ("CUPTI_ACTIVITY_KIND_KERNEL", "1"),
    "memcpy": ("CUPTI_ACTIVITY_KIND_MEMCPY", "1"),
    "memset": ("CUPTI_ACTIVITY_KIND_MEMSET", "1"),
    "cuda_api": ("CUPTI_ACTIVITY_KIND_RUNTIME", "1"),
    "nvtx": ("NVTX_EVENTS", "eventType IN (59, 60) AND end IS NOT NULL"),
    "osrt": ("OSRT_API", f"end - start >= {OSRT_MIN_NS} OR end < start"),
    "sync": ("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "1"),
}
IMPOSSIBLE = (  # rank 1: rows that end before they start, in five tables
    "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start - 1000 WHERE rowid <= 10",
    "UPDATE CUPTI_ACTIVITY_KIND_MEMCPY SET end = start - 5 WHERE rowid IN (3, 4)",
    "UPDATE NVTX_EVENTS SET end = start - 7 WHERE rowid IN "
    "(SELECT rowid FROM NVTX_EVENTS WHERE eventType = 59 ORDER BY rowid DESC LIMIT 3)",
    "UPDATE OSRT_API SET end = start - 1 WHERE rowid IN (SELECT rowid FROM OSRT_API LIMIT 4 OFFSET 20)",
    "UPDATE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION SET end = start - 1 WHERE rowid = 2",
)
# rank 2: a value of the wrong type in the last table the ingest writes (`sync`, after every
# other table of the batch on the scanner path, after its own other tables on sqlite3's), in a
# column that goes in unchanged, so that both engines refuse it.
FAILING = "UPDATE CUPTI_ACTIVITY_KIND_SYNCHRONIZATION SET correlationId = 'x' WHERE rowid = 7"


def _expected(f: Path) -> dict[str, tuple[int, int, int]]:
    """Per store table: (rows kept, rows that end before they start, sum of kept durations)."""
    con = sqlite3.connect(f)
    out = {}
    for table, (src, keep) in SOURCES.items():
        out[table] = con.execute(
            f"SELECT count(*) FILTER (WHERE end >= start), count(*) FILTER (WHERE end < start), "
            f"coalesce(sum(end - start) FILTER (WHERE end >= start), 0) FROM {src} WHERE {keep}").fetchone()
    con.close()
    return out


@pytest.mark.parametrize("how", ["scanner", "sqlite3", "parts", "parts-mapped-without-counts"])
def test_impossible_rows_counted_and_failed_rank_rolled_back(gpu_fixtures: Path, tmp_path: Path, how: str) -> None:
    src = tmp_path / "in"
    src.mkdir()
    base = sorted((gpu_fixtures / "ddp_straggler").glob("*.sqlite"))
    files = []
    for rank in range(4):  # one batch: the failing rank sits between good ones
        files.append(src / f"job_1_r{rank}_vm.{100 + rank}.sqlite")
        shutil.copy(base[rank % 2], files[-1])
    plant(files[1], *IMPOSSIBLE)
    plant(files[2], FAILING)
    want = {rank: _expected(f) for rank, f in enumerate(files)}
    assert all(want[1][t][1] > 0 for t in ("kernels", "memcpy", "nvtx", "osrt", "sync"))

    quiet = Console(stderr=True, quiet=True)
    if how.startswith("parts"):
        res = collect_parts([src], tmp_path / "run", layout=Layout(), console=quiet, workers=2,
                            view_min_rows=0)
    if how == "parts":  # each map counted its report's impossible rows, as sqlite3 counts them
        metas = [json.loads(m.read_text()) for m in (tmp_path / "run" / "parts" / "reports").glob("*.json")]
        counts = {m["map_rank"]: m.get("impossible") for m in metas}  # none for the failed map
        assert counts[1] == {t: want[1][t][1] for t in SOURCES if want[1][t][1]}, counts[1]
    if how == "parts-mapped-without-counts":  # parts of an orch whose maps did not count them
        for meta in (tmp_path / "run" / "parts" / "reports").glob("*.json"):
            meta.write_text(json.dumps({k: v for k, v in json.loads(meta.read_text()).items() if k != "impossible"}))
        res = collect_parts([src], tmp_path / "run", layout=Layout(), console=quiet, workers=2,
                            view_min_rows=0)
        assert res.reused == 3  # all but the failing report (a failed map is always redone)
    if not how.startswith("parts"):
        res = collect([src], tmp_path / "run", layout=Layout(), engine=how, console=quiet, workers=2)
    con = duckdb.connect(str(res.store), read_only=True)
    status = {r: (s, e or "") for r, s, e in con.execute("SELECT rank, status, error FROM ranks").fetchall()}
    assert status[2][0] == "error" and "failed" in status[2][1], status[2]
    for table in SOURCES:
        got = dict(con.execute(f'SELECT rank, (count(*), count(*) FILTER (WHERE "end" < start), '
                               f'coalesce(sum("end" - start), 0)) FROM {table} GROUP BY rank').fetchall())
        assert 2 not in got, (table, got.get(2))  # the failed rank's rows were rolled back
        for rank in (0, 1, 3):
            kept, _, dur = want[rank][table]
            assert got.get(rank, (0, 0, 0)) == (kept, 0, dur), (table, rank)
    for rank in (0, 1, 3):
        dropped = ", ".join(f"{want[rank][t][1]} {t}" for t in sorted(SOURCES) if want[rank][t][1])
        note = f"dropped rows that end before they start: {dropped}"
        assert (note in status[rank][1]) if dropped else ("end before they start" not in status[rank][1]), status
    con.close()
