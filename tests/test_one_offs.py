"""Idle that recurs in no other step, on a real capture of code nobody here wrote: the Hugging
Face Trainer (tests/fixtures/loops, hf_gpt2_accum4: transformers 5, one GPU under torchrun).

Under torchrun the Trainer runs with a process group of one, and its first logging step
all-gathers the loss (torch.distributed's all_gather, orch's Python samples say): NCCL creates its
communicator there, in the middle of training, and the GPU waits about 0.4 s. It happens once; a
fix of the loop saves none of it. Every expected number is plain sqlite3 over the export."""

from __future__ import annotations

import lzma
import shutil
import sqlite3
from pathlib import Path

import pytest

from orchestrator.api import open_store
from orchestrator.metrics.engine import CALL_GAP
from tests.independent import gpu_gaps, gpu_ops
from tests.stores import Stores

pytestmark = pytest.mark.replay

EXPORT = Path(__file__).parent / "fixtures" / "loops" / "hf_gpt2_accum4_r0_vm.879.sqlite.xz"
INIT = "ncclCommInitRankConfig"


def _init_gaps_ms(export: Path, w0: int, w1: int) -> float:
    """The GPU's gaps of 1 ms or more inside [w0, w1) whose midpoint lies in NCCL's own range
    `ncclCommInitRankConfig`."""
    con = sqlite3.connect(export)
    try:
        ranges = con.execute("SELECT n.start, n.\"end\" FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId "
                             "WHERE s.value = ?", (INIT,)).fetchall()
        gaps = gpu_gaps(gpu_ops(con))
    finally:
        con.close()
    assert len(ranges) == 1, ranges
    (a, b), = ranges
    return sum(e - s for s, e in gaps if e - s >= 1_000_000 and w0 <= s and e <= w1 and a <= (s + e) // 2 < b) / 1e6


def test_a_trainers_first_collective_making_ncclcomm_is_one_off(stores: Stores, tmp_path: Path) -> None:
    run, report, text = stores.report("loops-hf_gpt2_accum4")
    group = f"{CALL_GAP}NCCL:{INIT}"
    export = tmp_path / "hf.sqlite"
    with lzma.open(EXPORT, "rb") as src, open(export, "wb") as out:
        shutil.copyfileobj(src, out)
    with open_store(run / "profile.duckdb") as store:
        (w,) = store.view("win").to_pylist()
        (r,) = store.table("ranks").to_pylist()
        once = [o for o in store.view("oneoff_gaps").to_pylist() if o["range_group"] == group]
    off = r["clock_offset_ns"] + (r["clock_correction_ns"] or 0)  # the store's clock is the export's + off
    want = _init_gaps_ms(export, w["w0"] - off, w["w1"] - off)
    assert want > 400  # one gap of 407.7 ms

    assert [r["init"] for r in once] == [True]
    assert float(once[0]["ns"]) / 1e6 == pytest.approx(want, abs=0.01)
    (rank,) = report["ranks"]
    assert rank["gaps_by_range_ms"][group] == pytest.approx(want, abs=0.01)
    # Left out of every cost: what is left in Python between CUDA calls is under cpu_gap's tenth.
    assert not [f for f in report["findings"] if f["kind"] == "cpu_gap"], report["findings"]
    assert "one-time initialisation" in text
