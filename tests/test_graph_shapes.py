"""A compiled loop that keeps recording CUDA graphs, on real captures (tests/fixtures/loops, README
there, one H100): the GPT under torch.compile(mode="reduce-overhead") over documents of 32 to 256
tokens, each batch padded to its longest, so that a new length means a new graph (CUDA graph
trees warm a new shape up eagerly, then record it), and its twin padded to a multiple of 64.

orch counts the stream captures begun in each analysed step. The expected numbers are plain
sqlite3 over the exports, with orch's steps taken from its loop marks as the truth files take
them: from one `orch: optimizer.step` range's end to the next."""

from __future__ import annotations

import bisect
import lzma
import shutil
import sqlite3
from pathlib import Path

import pytest

from orchestrator.analyze.rules.cuda_graphs import RECORDING_STEPS
from tests.stores import Stores

pytestmark = pytest.mark.replay

LOOPS = Path(__file__).parent / "fixtures" / "loops"


def _captures_by_step(stem: str, tmp: Path) -> dict[int, int]:
    """Stream captures begun in each step after the first (step k: from the k-th optimizer
    step's end to the k+1-th's, k from 1), by plain sqlite3 over the export."""
    (src,) = LOOPS.glob(f"{stem}_r0_*.sqlite.xz")
    export = tmp / f"{stem}.sqlite"
    with lzma.open(src, "rb") as fi, open(export, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    con = sqlite3.connect(export)
    try:
        ends = [e for (e,) in con.execute(
            "SELECT e.\"end\" FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
            "WHERE coalesce(e.text, s.value) = 'orch: optimizer.step' ORDER BY 1")]
        starts = [s for (s,) in con.execute(
            "SELECT r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds n ON n.id = r.nameId "
            "WHERE n.value LIKE 'cudaStreamBeginCapture%'")]
    finally:
        con.close()
    out: dict[int, int] = {}
    for s in starts:
        k = bisect.bisect_right(ends, s)  # ends before it: it began in step k
        if 1 <= k < len(ends):
            out[k] = out.get(k, 0) + 1
    return out


def test_graphs_recorded_for_new_shapes_are_named_with_the_padding_fix(stores: Stores, tmp_path: Path) -> None:
    by_step = _captures_by_step("loops_varlen_ro", tmp_path)
    assert len(by_step) >= RECORDING_STEPS + 5  # recording recurs well past the first steps
    _, report, _ = stores.report("loops-loops_varlen_ro")
    top = report["findings"][0]
    n = len(report["steps"]) - 1
    assert top["kind"] == "cuda_graphs" and top["ranks"] == [0] and top["severity"] == "high"
    assert top["title"].startswith(f"CUDA graphs recorded anew for new input shapes in {len(by_step)} of {n} steps")
    assert (f"rank 0: {sum(by_step.values())} CUDA graphs recorded (stream captures begun) in {len(by_step)} of its "
            f"{n} analysed steps") in "\n".join(top["evidence"])
    assert top["fix"].startswith("The loop keeps recording CUDA graphs") and "pad_to_multiple_of" in top["fix"]


def test_a_padded_twin_records_its_graphs_once(stores: Stores, tmp_path: Path) -> None:
    """Padded to a multiple of 64 every batch of this capture is 256 tokens: its graphs are
    recorded in its first analysed step and replayed after; nothing above info."""
    by_step = _captures_by_step("loops_varlen_ro_pad64", tmp_path)
    assert len(by_step) < RECORDING_STEPS
    _, report, _ = stores.report("loops-loops_varlen_ro_pad64")
    assert all(f["severity"] == "info" for f in report["findings"])
    (graphs,) = [f for f in report["findings"] if f["kind"] == "cuda_graphs"]
    assert graphs["title"].startswith("CUDA graphs replayed") and "recorded (stream captures" not in str(graphs)
