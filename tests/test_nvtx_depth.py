"""NVTX nesting depth, as `orch collect` stores it (collect/extract.py, a running count of open
ranges per thread and domain), against a brute-force count made by sqlite3 on the export itself:
the ranges of the same thread and domain still open where a range starts."""

from __future__ import annotations

import gzip
import shutil
import sqlite3
from collections import Counter
from pathlib import Path

import duckdb
import pytest

from orchestrator.collect.collect import collect
from orchestrator.collect.identity import Layout

pytestmark = pytest.mark.fast

FIXTURES = Path(__file__).parent / "fixtures"
# Real H200 exports with two threads and two or three NVTX domains (NCCL's and torch's).
EXPORTS = ["comm/ddp_r0_vm.1266.sqlite.gz", "gpu_e2e/ddp_r0_vm.763.sqlite.gz"]

# Open at r's start: started earlier and ending after it (a range ending exactly there is closed:
# ends come first at equal times), or started at the same time and longer (parents open first).
ORACLE = """
WITH r AS (
    SELECT rowid AS id, start AS s, "end" AS e, globalTid AS tid, coalesce(domainId, 0) AS dom
    FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND "end" IS NOT NULL AND "end" >= start
)
SELECT r.s, r.e, r.tid, r.dom,
       (SELECT count(*) FROM r o WHERE o.tid = r.tid AND o.dom = r.dom AND o.id <> r.id AND o.e > r.s
                                  AND (o.s < r.s OR (o.s = r.s AND o.e > r.e))) AS depth,
       -- ties the order cannot settle: an exact twin, or a zero-length range starting with it
       EXISTS (SELECT 1 FROM r o WHERE o.tid = r.tid AND o.dom = r.dom AND o.id <> r.id AND o.s = r.s
                                  AND (o.e = r.e OR o.e = o.s)) AS ambiguous
FROM r
"""


def _oracle(export: Path) -> tuple[Counter, int]:
    con = sqlite3.connect(export)
    try:
        rows = con.execute(ORACLE).fetchall()
    finally:
        con.close()
    return Counter((s, e, tid, dom, d) for s, e, tid, dom, d, amb in rows if not amb), sum(r[5] for r in rows)


@pytest.mark.parametrize("engine", ["scanner", "sqlite3"])
@pytest.mark.parametrize("name", EXPORTS)
def test_nvtx_depth_matches_open_ranges(tmp_path: Path, name: str, engine: str) -> None:
    src = tmp_path / "in" / Path(name).name.removesuffix(".gz")
    src.parent.mkdir()
    with gzip.open(FIXTURES / name, "rb") as f, src.open("wb") as out:
        shutil.copyfileobj(f, out)
    want, ambiguous = _oracle(src)
    res = collect([src.parent], tmp_path / "run", layout=Layout(), workers=1, engine=engine)
    con = duckdb.connect(str(res.store), read_only=True)
    try:
        rows = con.execute('SELECT start, "end", tid, domain_id, depth FROM nvtx').fetchall()
    finally:
        con.close()
    shift = min(k[0] for k in want) - min(r[0] for r in rows)  # the store's clock is one constant apart
    got = Counter((s + shift, e + shift, tid, dom, d) for s, e, tid, dom, d in rows)
    assert len({k[2] for k in want}) >= 2 and len({k[3] for k in want}) >= 2  # threads, domains
    assert max(k[4] for k in want) >= 2 and sum(want.values()) > 300
    assert ambiguous < sum(want.values()) // 10
    assert not (want - got), f"depths differ: {sorted(want - got)[:5]}"
