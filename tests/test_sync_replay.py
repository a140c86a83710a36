"""A host sync in every step of a one-GPU loop, costed by replaying the rank's own GPU work without
it (55_host_sync.sql `_sync_replay`), on real captures (tests/fixtures/loops, README there, one
H100): torchvision's ResNet-18 printing `loss.item()` after every optimizer step, and its twin
printing every 10 steps.

The expected saving is the same replay computed independently: the GPU ops read from the export
with plain sqlite3, walked one by one in Python (each op no earlier than the previous one's end
plus the gap it had, at most 2 us; one that waited for its launch no earlier than its start less
the CPU time blocked in the syncs that returned before it), against the closed form orch runs in
SQL. The syncs' blocked time is orch's `host_syncs` (tests/test_host_sync*.py hold those)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from orchestrator.api import open_store
from tests.independent import gpu_ops
from tests.stores import Stores, loop_export

pytestmark = pytest.mark.replay

QUEUED_GAP_NS = 2000


def _replayed_saving_ns(export: Path, w0: int, w1: int, syncs: list[tuple[int, int]]) -> float:
    """The ops starting in [w0, w1), in (start, end) order, replayed one by one without `syncs`
    ((start, end) on the export's clock): the last end less the last replayed end."""
    con = sqlite3.connect(export)
    try:
        ops = gpu_ops(con, "WHERE start >= ? AND start < ?", (w0, w1))
    finally:
        con.close()
    returns = sorted(syncs, key=lambda s: s[1])
    back, i = 0, 0
    prev_end = prev_rep = None
    last_end = last_rep = float("-inf")
    for start, end in ops:
        while i < len(returns) and returns[i][1] <= start:
            back += returns[i][1] - returns[i][0]
            i += 1
        gap = None if prev_end is None else start - prev_end
        rep = end - back if gap is None or gap > QUEUED_GAP_NS else float("-inf")
        if prev_rep is not None:
            rep = max(rep, prev_rep + min(gap, QUEUED_GAP_NS) + end - start)
        prev_end, prev_rep = end, rep
        last_end, last_rep = max(last_end, end), max(last_rep, rep)
    return last_end - last_rep


def _orch_side(run: Path) -> tuple[int, int, list[tuple[int, int]], dict]:
    """The report's window and host syncs on the export's own clock, and its sync_stats row."""
    with open_store(run / "profile.duckdb") as store:
        (w,) = store.view("win").to_pylist()
        (r,) = store.table("ranks").to_pylist()
        syncs = store.view("host_syncs").to_pylist()
        (stats,) = store.view("sync_stats").to_pylist()
    off = r["clock_offset_ns"] + (r["clock_correction_ns"] or 0)
    return w["w0"] - off, w["w1"] - off, [(s["start"] - off, s["end"] - off) for s in syncs], stats


def test_a_sync_every_step_costs_what_its_own_replay_saves(stores: Stores, tmp_path: Path) -> None:
    run, report, _ = stores.report("loops-resnet18_logstep")
    w0, w1, syncs, stats = _orch_side(run)
    want = _replayed_saving_ns(loop_export("resnet18_logstep", tmp_path), w0, w1, syncs)
    assert len(syncs) >= 29  # one a step, and the step timer's
    assert abs(stats["replay_saving_ns"] - want) <= 1000, (stats["replay_saving_ns"], want)
    # more than the idle right after the syncs: the launch gaps after it count too
    assert want > 2 * stats["idle_after_ns"]
    top = report["findings"][0]
    assert top["kind"] == "host_sync" and top["ranks"] == [0] and top["severity"] != "info"
    assert top["cost_ms"] == pytest.approx(want / 1e6, abs=0.01)
    assert any("replayed on its own GPU with no host sync" in e for e in top["evidence"])


def test_its_twin_logging_every_ten_steps_saves_little(stores: Stores, tmp_path: Path) -> None:
    run, report, _ = stores.report("loops-resnet18_log10")
    w0, w1, syncs, stats = _orch_side(run)
    want = _replayed_saving_ns(loop_export("resnet18_log10", tmp_path), w0, w1, syncs)
    assert abs(stats["replay_saving_ns"] - want) <= 1000, (stats["replay_saving_ns"], want)
    assert want < 0.02 * (w1 - w0)
    assert not [f for f in report["findings"] if f["kind"] == "host_sync" and f["severity"] != "info"]


def test_the_unchanged_trace_replays_exactly(tmp_path: Path) -> None:
    """The walk above with no sync moved back ends where the capture ends: the model adds
    nothing of its own."""
    export = loop_export("resnet18_logstep", tmp_path)
    con = sqlite3.connect(export)
    try:
        w0, w1 = con.execute("SELECT min(start), max(\"end\") + 1 FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    finally:
        con.close()
    assert _replayed_saving_ns(export, w0, w1, []) == 0
