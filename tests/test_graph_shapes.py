"""A compiled loop that keeps recording CUDA graphs, on real captures (tests/fixtures/loops, README
there, one H100): the GPT under torch.compile(mode="reduce-overhead") over documents of 32 to 256
tokens, each batch padded to its longest, so that a new length means a new graph (CUDA graph
trees warm a new shape up eagerly, then record it), and its twin padded to a multiple of 64.

orch counts the stream captures begun in each analysed step: in 3 or more of them, recording
recurs (66_cuda_graphs.sql, graph_eager_steps). The expected numbers are plain sqlite3 over the
exports, with orch's steps taken from its loop marks as the truth files take them: from one
`orch: optimizer.step` range's end to the next."""

from __future__ import annotations

import bisect
import sqlite3
from pathlib import Path

import pytest

from orchestrator.api import open_store
from orchestrator.collect.collect import collect, collect_parts
from orchestrator.layout import Layout
from orchestrator.metrics.engine import Options
from tests.stores import Stores, loop_export
from tests.test_parts import QUIET, assert_same_store, lists_and_report, same_reports

pytestmark = pytest.mark.replay



def _graph_calls_by_step(stem: str, tmp: Path) -> dict[int, tuple[int, int]]:
    """Each step after the first (step k: from the k-th optimizer step's end to the k+1-th's, k
    from 1): its graph replays (cudaGraphLaunch) and the stream captures begun in it, by plain
    sqlite3 over the export."""
    con = sqlite3.connect(loop_export(stem, tmp))
    try:
        ends = [e for (e,) in con.execute(
            "SELECT e.\"end\" FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
            "WHERE coalesce(e.text, s.value) = 'orch: optimizer.step' ORDER BY 1")]
        calls = con.execute(
            "SELECT r.start, n.value LIKE 'cudaStreamBeginCapture%' FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
            "JOIN StringIds n ON n.id = r.nameId "
            "WHERE n.value LIKE 'cudaStreamBeginCapture%' OR n.value LIKE 'cudaGraphLaunch%'").fetchall()
    finally:
        con.close()
    out = {k: (0, 0) for k in range(1, len(ends))}
    for start, capture in calls:
        k = bisect.bisect_right(ends, start)  # ends before it: it began in step k
        if k in out:
            replays, captures = out[k]
            out[k] = (replays, captures + 1) if capture else (replays + 1, captures)
    return out


def _captures_by_step(stem: str, tmp: Path) -> dict[int, int]:
    """The steps after the first that begin a stream capture, and how many."""
    return {k: c for k, (_, c) in _graph_calls_by_step(stem, tmp).items() if c}


def test_graphs_recorded_for_new_shapes_are_named_with_the_padding_fix(stores: Stores, tmp_path: Path) -> None:
    by_step = _captures_by_step("loops_varlen_ro", tmp_path)
    assert len(by_step) >= 8  # recording recurs well past the first steps
    _, report, _ = stores.report("loops-loops_varlen_ro")
    top = report["findings"][0]
    n = len(report["steps"]) - 1
    assert top["kind"] == "cuda_graphs" and top["ranks"] == [0] and top["severity"] == "high"
    assert top["title"].startswith(f"CUDA graphs recorded anew for new input shapes in {len(by_step)} of {n} steps")
    calls = _graph_calls_by_step("loops_varlen_ro", tmp_path)
    eager = [k for k, (replays, captures) in calls.items() if replays == 0 or captures]
    assert (f"rank 0: {sum(by_step.values())} CUDA graphs recorded (stream captures begun) in {len(by_step)} of its "
            f"{n} analysed steps, and {len(eager)} of those steps ran the model eagerly") in "\n".join(top["evidence"])
    assert top["fix"].startswith("The loop keeps recording CUDA graphs") and "pad_to_multiple_of" in top["fix"]


def test_a_padded_twin_records_its_graphs_once(stores: Stores, tmp_path: Path) -> None:
    """Padded to a multiple of 64 every batch of this capture is 256 tokens: its graphs are
    recorded in its first analysed step and replayed after; nothing above info."""
    by_step = _captures_by_step("loops_varlen_ro_pad64", tmp_path)
    assert len(by_step) < 3
    _, report, _ = stores.report("loops-loops_varlen_ro_pad64")
    assert all(f["severity"] == "info" for f in report["findings"])
    (graphs,) = [f for f in report["findings"] if f["kind"] == "cuda_graphs"]
    assert graphs["title"].startswith("CUDA graphs replayed") and "recorded (stream captures" not in str(graphs)


def test_the_steps_that_warm_up_or_record_hold_the_idle_of_the_recording(stores: Stores, tmp_path: Path) -> None:
    """A new length's first step runs the compiled model eagerly (the warm-up, no replay), its
    next records the graphs (a capture): those steps are the recording's, and CUDA graph trees
    synchronise in each. The host syncs and the loop thread's waits in them are not findings of
    their own; the few steps that only replay keep theirs (the loss's `.item()` every 10 steps)."""
    calls = _graph_calls_by_step("loops_varlen_ro", tmp_path)
    eager = {k for k, (replays, captures) in calls.items() if replays == 0 or captures}
    assert 0 < len(calls) - len(eager) < 10  # a few steps only replay
    run, report, _ = stores.report("loops-loops_varlen_ro")
    with open_store(run / "profile.duckdb") as store:
        got = {r["step"] for r in store.view("graph_eager_steps").to_pylist()}
    assert got == eager
    assert [f["kind"] for f in report["findings"] if f["severity"] != "info"] == ["cuda_graphs"]


def test_the_map_finds_the_same_recording_steps(tmp_path: Path) -> None:
    """The steps that warm up or record are a map table: the store whose rank was mapped reads
    them from its map, and its report is the in-process one."""
    src = tmp_path / "src"
    src.mkdir()
    loop_export("loops_varlen_ro", src)
    a = collect([src], tmp_path / "a", layout=Layout(), console=QUIET, workers=2)
    b = collect_parts([src], tmp_path / "b", layout=Layout(), console=QUIET, workers=2, summaries=True)
    assert_same_store(a.store, b.store)
    lists, report = lists_and_report(b.store, Options(), "map_ranks", "graph_eager_steps")
    assert lists == [[0], [0]]
    same_reports(lists_and_report(a.store, Options())[1], report)
