"""The pipeline's microbatches per step read from the trace when the spec does not give them: a
real DP2 x PP2 GPipe job (tests/fixtures/dp2pp2-gpipe, README there) whose first stage sends each
microbatch's activations once an iteration. The count comes from plain sqlite3 over the
exports; the schedule's own bubble, (p-1)/(m+p-1), is then the schedule's, not a fault's."""

from __future__ import annotations

import lzma
import shutil
import sqlite3
from pathlib import Path

import pytest

from orchestrator.analyze.build import build_report
from orchestrator.collect.collect import collect
from orchestrator.layout import Layout
from orchestrator.metrics.engine import Options

pytestmark = pytest.mark.replay

FIX = Path(__file__).parent / "fixtures" / "dp2pp2-gpipe"


def _sends_per_iteration(export: Path) -> list[int]:
    """NCCL's `ncclSend` ranges inside each `iteration N` range of one rank (plain sqlite3)."""
    con = sqlite3.connect(export)
    try:
        text = "coalesce(e.text, s.value)"
        its = con.execute(f"SELECT e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                          f"WHERE {text} LIKE 'iteration %' ORDER BY e.start").fetchall()
        sends = [r[0] for r in con.execute(f"SELECT e.start FROM NVTX_EVENTS e LEFT JOIN StringIds s "
                                           f"ON s.id = e.textId WHERE {text} = 'ncclSend'")]
        rank = con.execute("SELECT value FROM META_DATA_CAPTURE WHERE value LIKE 'RANK=%'").fetchone()[0]
    finally:
        con.close()
    assert rank in ('RANK="0"', 'RANK="1"', 'RANK="2"', 'RANK="3"')
    return [sum(a <= t < b for t in sends) for a, b in its]


@pytest.mark.parametrize("run", ["slow", "ok"])
def test_the_microbatches_come_from_the_first_stages_sends_and_the_schedules_bubble_is_no_finding(
        run: str, tmp_path: Path) -> None:
    inp = tmp_path / "in"
    inp.mkdir()
    for f in FIX.glob(f"{run}_*.sqlite.xz"):
        with lzma.open(f) as src, open(inp / f.name.removesuffix(".xz"), "wb") as dst:
            shutil.copyfileobj(src, dst)
    firsts = []  # the stage-0 ranks (rank // 2 == 0 under the job's ("pp", "dp") mesh)
    for f in sorted(inp.iterdir()):
        con = sqlite3.connect(f)
        rank = int(con.execute("SELECT value FROM META_DATA_CAPTURE WHERE value LIKE 'RANK=%'")
                   .fetchone()[0].split("=")[1].strip('"'))
        con.close()
        if rank // 2 == 0:
            firsts += _sends_per_iteration(f)
    (m,) = set(firsts)
    assert m == 4
    store = collect([inp], tmp_path / "run", layout=Layout.parse("pp=2,dp=2"), workers=1).store
    rep = build_report(store, Options())
    theory = round(100 * (2 - 1) / (m + 2 - 1), 2)
    assert {(s.microbatches, s.theory_bubble_pct) for s in rep.stages} == {(m, theory)}
    for f in rep.findings:  # the schedule's own 20 % is no fault's: no bubble finding claims it
        assert f.kind != "pipeline_bubble" or f.severity == "info" or "above the schedule's" in f.title, f
    with_spec = build_report(store, Options(microbatches=8))  # --microbatches outranks the trace
    assert {s.microbatches for s in with_spec.stages} == {8}
