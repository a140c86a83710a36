"""A one-GPU loop's host syncs and waits for input, each costed by replaying the rank's own GPU
work without them (55_own_replay.sql), on real captures (tests/fixtures/loops, README there, one
H100 or H200): torchvision's ResNet-18 printing `loss.item()` after every optimizer step, and its
twin printing every 10 steps; the eager GPT whose DataLoader starts its workers anew every epoch,
and its twin with persistent workers; the HF Trainer starting its workers anew every epoch; the
GPT whose loop thread tokenises every sample itself, and the ResNet-18 whose loop thread decodes
every image itself.

The expected saving is the same replay computed independently: the GPU ops read from the export
with plain sqlite3, walked one by one in Python (each op no earlier than the previous one's end
plus the gap it had, at most 2 us; one that waited for its launch no earlier than its start less
the CPU time removed before it), against the closed form orch runs in SQL. The syncs' blocked
time is orch's `host_syncs` (tests/test_host_sync*.py hold those); the input's is read from the
export: the loop thread's ranges of orch's loop marks that wait for a batch."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from orchestrator.api import open_store
from tests.independent import gpu_ops
from tests.stores import Stores, loop_export

pytestmark = pytest.mark.replay

QUEUED_GAP_NS = 2000


def _replayed_saving_ns(export: Path, w0: int, w1: int, removed: list[tuple[int, int]]) -> float:
    """The ops starting in [w0, w1), in (start, end) order, replayed one by one without the CPU
    time `removed` ((start, end) on the export's clock, none overlapping another): the last end
    less the last replayed end."""
    con = sqlite3.connect(export)
    try:
        ops = gpu_ops(con, "WHERE start >= ? AND start < ?", (w0, w1))
    finally:
        con.close()
    returns = sorted(removed, key=lambda s: s[1])
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


def _orch_side(run: Path, what: str = "host syncs") -> tuple[int, int, list[tuple[int, int]], dict, int]:
    """The report's window and host syncs on the export's own clock, its sync_stats row and what
    its own replay without `what` saves."""
    with open_store(run / "profile.duckdb") as store:
        (w,) = store.view("win").to_pylist()
        (r,) = store.table("ranks").to_pylist()
        syncs = store.view("host_syncs").to_pylist()
        (stats,) = store.view("sync_stats").to_pylist()
        own = [x["saving_ns"] for x in store.view("own_replay").to_pylist() if x["what"] == what]
    off = r["clock_offset_ns"] + (r["clock_correction_ns"] or 0)
    return (w["w0"] - off, w["w1"] - off, [(s["start"] - off, s["end"] - off) for s in syncs], stats,
            own[0] if own else 0)


def test_a_sync_every_step_costs_what_its_own_replay_saves(stores: Stores, tmp_path: Path) -> None:
    run, report, _ = stores.report("loops-resnet18_logstep")
    w0, w1, syncs, stats, saving = _orch_side(run)
    want = _replayed_saving_ns(loop_export("resnet18_logstep", tmp_path), w0, w1, syncs)
    assert len(syncs) >= 29  # one a step, and the step timer's
    assert abs(saving - want) <= 1000, (saving, want)
    # more than the idle right after the syncs: the launch gaps after it count too
    assert want > 2 * stats["idle_after_ns"]
    top = report["findings"][0]
    assert top["kind"] == "host_sync" and top["ranks"] == [0] and top["severity"] != "info"
    assert top["cost_ms"] == pytest.approx(want / 1e6, abs=0.01)
    assert any("replayed on its own GPU with no host sync" in e for e in top["evidence"])


def test_its_twin_logging_every_ten_steps_saves_little(stores: Stores, tmp_path: Path) -> None:
    run, report, _ = stores.report("loops-resnet18_log10")
    w0, w1, syncs, _, saving = _orch_side(run)
    want = _replayed_saving_ns(loop_export("resnet18_log10", tmp_path), w0, w1, syncs)
    assert abs(saving - want) <= 1000, (saving, want)
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


def _waits_for_input(export: Path, w0: int, w1: int) -> list[tuple[int, int]]:
    """The loop thread's waits for a batch, from the export with plain sqlite3: orch's loop marks
    `orch: next batch` and `orch: loader start` on the thread that marks the optimizer's steps,
    cut to [w0, w1] and merged where they overlap."""
    con = sqlite3.connect(export)
    try:
        rows = con.execute(
            "SELECT n.start, n.\"end\" FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId "
            "WHERE s.value IN ('orch: next batch', 'orch: loader start') AND n.\"end\" > ? AND n.start < ? "
            "AND n.globalTid = (SELECT m.globalTid FROM NVTX_EVENTS m JOIN StringIds t ON t.id = m.textId "
            "                   WHERE t.value = 'orch: optimizer.step' LIMIT 1) ORDER BY n.start",
            (w0, w1)).fetchall()
    finally:
        con.close()
    merged: list[list[int]] = []
    for start, end in rows:
        start, end = max(start, w0), min(end, w1)
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


@pytest.mark.parametrize("case, stem", [("loops-loops_epochs_np", "loops_epochs_np"),
                                        ("loops-loops_tokenise_w0", "loops_tokenise_w0"),
                                        ("loops-resnet18_decode_w0", "resnet18_decode_w0"),
                                        ("loops-hf_epochs_np", "hf_epochs_np")])
def test_a_wait_for_input_costs_what_its_own_replay_saves(stores: Stores, tmp_path: Path, case: str,
                                                          stem: str) -> None:
    """Workers started anew every epoch (a loop of our own, the HF Trainer's), a loop thread
    tokenising its own samples, and one decoding its own images while its GPU still runs the step
    before: each rank's wait for input replayed away, by orch and by the walk; the data-loader
    finding's cost is that saving."""
    run, report, _ = stores.report(case)
    w0, w1, _, _, saving = _orch_side(run, "input")
    export = loop_export(stem, tmp_path)
    waits = _waits_for_input(export, w0, w1)
    want = _replayed_saving_ns(export, w0, w1, waits)
    assert len(waits) >= 10 and want > 0.05 * (w1 - w0)
    assert abs(saving - want) <= 1000, (saving, want)
    (f,) = [f for f in report["findings"] if f["kind"] == "data_loader_stall"]
    assert f["ranks"] == [0] and f["severity"] != "info"
    assert f["cost_ms"] == pytest.approx(want / 1e6, abs=0.01)
    assert any("replayed on its own GPU with its input on time" in e for e in f["evidence"])


def test_persistent_workers_leave_little_to_save(stores: Stores, tmp_path: Path) -> None:
    """loops_epochs_np's twin with persistent workers: the same walk saves under a tenth of what it
    saves there, and no data-loader finding above `info`."""
    run, report, _ = stores.report("loops-loops_epochs_p")
    w0, w1, _, _, saving = _orch_side(run, "input")
    export = loop_export("loops_epochs_p", tmp_path)
    want = _replayed_saving_ns(export, w0, w1, _waits_for_input(export, w0, w1))
    assert abs(saving - want) <= 1000, (saving, want)
    assert want < 0.1 * _orch_side(stores.report("loops-loops_epochs_np")[0], "input")[4]
    assert not [f for f in report["findings"] if f["kind"] == "data_loader_stall" and f["severity"] != "info"]
