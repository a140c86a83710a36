"""A DataLoader whose workers start anew every epoch (persistent_workers=False, the DataLoader's
default and the HF Trainer's), on real captures (tests/fixtures/loops, README there, one H100): the
eager GPT over a dataset of 8 optimizer steps an epoch with 4 workers, the HF Trainer's GPT-2 over
4-step epochs with 4 workers, and each one's twin with persistent workers.

orch's loop marks put each start of an epoch's batches (DataLoader.__iter__, where the workers are
forked) in `orch: loader start`. The board's reports are of the exports alone, without the run's
loader settings: the loop thread's `fork` calls in that idle say the workers start anew. The
expected numbers are plain sqlite3 over the exports."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from orchestrator.api import open_store
from tests.independent import gpu_gaps, gpu_ops
from tests.stores import Stores, loop_export

pytestmark = pytest.mark.replay

START = "orch: loader start"


def _restart_idle_ms(export: Path, w0: int, w1: int) -> float:
    """The GPU's gaps of 1 ms or more inside [w0, w1] of which an `orch: loader start` range
    covers at least half."""
    con = sqlite3.connect(export)
    try:
        starts = con.execute("SELECT e.start, e.\"end\" FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                             "WHERE coalesce(e.text, s.value) = ?", (START,)).fetchall()
        gaps = [(s, e) for s, e in gpu_gaps(gpu_ops(con)) if e - s >= 1_000_000 and w0 <= s and e <= w1]
    finally:
        con.close()
    return sum(e - s for s, e in gaps if any(2 * (min(e, b) - max(s, a)) >= e - s for a, b in starts)) / 1e6


def _window(run: Path) -> tuple[int, int]:
    """The report's window on the export's own clock."""
    with open_store(run / "profile.duckdb") as store:
        (w,) = store.view("win").to_pylist()
        (r,) = store.table("ranks").to_pylist()
    off = r["clock_offset_ns"] + (r["clock_correction_ns"] or 0)
    return w["w0"] - off, w["w1"] - off


@pytest.mark.parametrize("stem", ["loops_epochs_np", "hf_epochs_np"])
def test_workers_started_every_epoch_are_the_input_stall_and_the_fix_keeps_them(stores: Stores, tmp_path: Path,
                                                                                 stem: str) -> None:
    run, report, _ = stores.report(f"loops-{stem}")
    want = _restart_idle_ms(loop_export(stem, tmp_path), *_window(run))
    assert want > 300  # four or five epoch starts of 100 ms or more each
    top = report["findings"][0]
    assert top["kind"] == "data_loader_stall" and top["ranks"] == [0] and top["severity"] == "high"
    assert top["fix"].startswith("Rank(s) 0 start their DataLoader's workers anew every epoch: DataLoader(..., "
                                 "persistent_workers=True) keeps them")
    (line,) = [e for e in top["evidence"] if START in e]
    assert line.startswith(f"rank 0: {round(want, 3)} ms of it while the loop thread started an epoch's batches")


@pytest.mark.parametrize("stem", ["loops_epochs_p", "hf_epochs_p"])
def test_persistent_workers_leave_no_input_stall(stores: Stores, tmp_path: Path, stem: str) -> None:
    """The twins' epochs start too, but their workers are already running: the loader start
    holds a few ms of GPU idle an epoch at most, and no input finding comes out."""
    run, report, _ = stores.report(f"loops-{stem}")
    assert _restart_idle_ms(loop_export(stem, tmp_path), *_window(run)) < 10
    assert not [f for f in report["findings"] if f["kind"] == "data_loader_stall" and f["severity"] != "info"]
