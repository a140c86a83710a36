"""`orch diff A B` closes the profile -> fix -> measure loop on real pairs (tests/fixtures/loops,
README there): the run orch diagnosed, and the same loop with the fix, both captured alike. A's
finding is gone in B, and what B measured (A's analysed steps at B's pace) is held against what
the finding predicted. The expected steps come from plain sqlite3 over the exports, with orch's
steps taken from its loop marks as the truth files take them: step k runs from the k-th
`orch: optimizer.step` range's end to the next (k from 1; the last one is incomplete)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from orchestrator.analyze.model_report import Report
from orchestrator.report.diff import diff_reports
from orchestrator.report.findings_diff import findings_lines
from tests.conftest import REPO, run_orch
from tests.stores import Stores, loop_export
from tests.truth.loops import opt_step_ms

pytestmark = pytest.mark.replay
FIXTURES = REPO / "tests" / "fixtures"


def _report(stores: Stores, case: str) -> Report:
    return Report.model_validate(stores.report(case)[1])


def _steps(stem: str, tmp: Path) -> dict[int, float]:
    """Step k -> its ms, for the complete analysed steps (1 .. the one before the last), by plain
    sqlite3."""
    import sqlite3

    con = sqlite3.connect(loop_export(stem, tmp))
    try:
        ms = opt_step_ms(con)
    finally:
        con.close()
    return {k: ms[k - 1] for k in range(1, len(ms))}  # ms[k - 1]: step k; the last step is not complete


def _long(steps: dict[int, float]) -> set[int]:
    """The steps over 3x the median, where they are at most a quarter of them."""
    med = statistics.median(steps.values())
    out = {k for k, v in steps.items() if v > 3 * med}
    return out if len(out) <= 0.25 * len(steps) else set()


@pytest.mark.parametrize(("slow", "fast", "kind"), [
    ("loops_varlen_ro_rerun", "loops_varlen_ro_pad64_rerun", "cuda_graphs"),  # a graph recorded for each new shape
    ("hf_epochs_np", "hf_epochs_p", "data_loader_stall"),  # the Trainer's workers started anew every epoch
])
def test_the_fixed_finding_is_gone_and_held_to_what_the_fix_measured(stores: Stores, tmp_path: Path, slow: str,
                                                                     fast: str, kind: str) -> None:
    a, b = _report(stores, f"loops-{slow}"), _report(stores, f"loops-{fast}")
    got = diff_reports(a, b)["findings"]
    sa, sb = _steps(slow, tmp_path), _steps(fast, tmp_path)
    once = _long(sa) | _long(sb)
    assert once, "each pair has a one-off step: a recompile, a communicator's creation"
    assert {s.step for s in a.steps if s.oneoff} | {s.step for s in b.steps if s.oneoff} == once
    pa = statistics.fmean(v for k, v in sa.items() if k not in once)
    pb = statistics.fmean(v for k, v in sb.items() if k not in once)
    n = len(sa) + 1  # the analysed steps: the complete ones and the last
    assert got["steps"] == n and got["a_paced"] == got["b_paced"] == len(sa) - len(once)
    assert got["a_pace_ms"] == pytest.approx(pa, abs=0.01) and got["b_pace_ms"] == pytest.approx(pb, abs=0.01)
    assert got["measured_ms"] == pytest.approx((pa - pb) * n, abs=0.5)
    (gone,) = [f for f in got["gone"] if f["costed"]]
    assert gone["kind"] == kind
    (finding,) = [f for f in a.findings if f.kind == kind]
    assert got["predicted_ms"] == finding.cost_ms
    assert got["off_pct"] == pytest.approx(100 * (finding.cost_ms / got["measured_ms"] - 1), abs=0.1)
    assert not any(f.kind == kind and f.severity != "info" for f in b.findings)


def test_hf_epochs_pace_keeps_the_epoch_starts_and_drops_the_communicator(stores: Stores) -> None:
    """The Trainer's epoch starts (every 4th step, 3x its other steps) are the loop's own pattern,
    which the fix saves every time; only step 10, where its first logging all-gather creates
    NCCL's communicator (946.8 ms by plain sqlite3), is one-off."""
    a = _report(stores, "loops-hf_epochs_np")
    assert [s.step for s in a.steps if s.oneoff] == [10]


def test_a_run_against_itself_measures_nothing_and_keeps_every_finding(stores: Stores) -> None:
    a = _report(stores, "loops-loops_varlen_ro_rerun")
    got = diff_reports(a, a)["findings"]
    assert got["gone"] == [] and got["new"] == [] and got["measured_ms"] == 0
    assert [f["kind"] for f in got["still"]] == [f.kind for f in a.findings if f.severity != "info"]
    assert got["predicted_ms"] is None
    assert any(line.startswith("still in B: cuda_graphs") for line in findings_lines(got))


def test_orch_diff_prints_the_check(stores: Stores, tmp_path: Path) -> None:
    """As a user runs it, on the two reports' JSON."""
    paths = []
    for case in ("loops-hf_epochs_np", "loops-hf_epochs_p"):
        p = tmp_path / f"{case}.json"
        p.write_text(_report(stores, case).model_dump_json())
        paths.append(str(p))
    out = run_orch("diff", *paths, "--json", str(tmp_path / "d.json"))
    assert "gone in B: high data_loader_stall (ranks [0]), predicted saving 889.8 ms" in out.stdout
    assert "measured: A's 23 analysed steps at B's pace take" in out.stdout
    assert "the fixed finding predicted 889.8 ms" in out.stdout
    assert json.loads((tmp_path / "d.json").read_text())["findings"]["predicted_ms"] == pytest.approx(889.8, abs=0.05)


# The board's measured pairs (A, its twin): every case with a twin but the two that pairs-healthy
# twins. That run's first 10 steps ran at 63-71 ms and its later ones at 50 ms, so its truths take
# the median step (tests/truth/pairs.py), while `orch diff` takes the mean a user measures: there
# it measures 38 and 44 % less than their truths.
PAIRS = [
    ("pairs-ddp2-slow-loader", "pairs-ddp2-healthy"), ("pairs-ddp2-input-bound", "pairs-ddp2-healthy"),
    ("pairs-ddp4-slow-loader", "pairs-ddp4-healthy"), ("pairs-pp-uneven", "pairs-pp-even"),
    ("pairs-pp-slow-input", "pairs-pp-even-h200"), ("pairs-pp4-uneven", "pairs-pp4-even"),
    ("pairs-pp4-slow-loader", "pairs-pp4-even"), ("dp2pp2-gpipe-slow", "dp2pp2-gpipe-ok"),
    ("gpu_e2e-ddp", "gpu_e2e-ok"),
    ("graphs-gpt_eager_nvtx", "graphs-gpt_eager_graphed_nvtx"), ("loops-loops_epochs_np", "loops-loops_epochs_p"),
    ("loops-hf_epochs_np", "loops-hf_epochs_p"), ("loops-loops_varlen_ro", "loops-loops_varlen_ro_pad64"),
    ("loops-loops_varlen_ro_rerun", "loops-loops_varlen_ro_pad64_rerun"),
]


def test_what_orch_diff_measures_on_the_boards_pairs_is_their_measured_difference(stores: Stores) -> None:
    """A's steps at B's pace against each pair's truth (tests/fixtures/truth: plain sqlite3 over
    both captures, each pair its own way), within 25 %: its slowest rank's mean step, not each
    step's slowest rank (in the 4-rank DDP job with one slow loader that would measure 3,829 ms
    against 1,815)."""
    off = {}
    for slow, fast in PAIRS:
        got = diff_reports(_report(stores, slow), _report(stores, fast))["findings"]["measured_ms"]
        truth = json.loads((FIXTURES / "truth" / f"{slow}.json").read_text())["saving_ms"]
        off[slow] = round(100 * (got / truth - 1), 1)
    assert all(abs(v) <= 25 for v in off.values()), off


def test_a_fix_that_makes_the_steps_faster_regresses_nothing_measured_in_time(stores: Stores) -> None:
    """With the fix, shorter steps make fixed costs a larger share of them and the rank that held
    the others up waits like the rest: on the measured pairs B runs faster beyond the steps' own
    variation and those rises are marked, not counted; undoing the fix regresses every time.
    Memory and bandwidth are no share of a step and are never waived."""
    for slow, fast in PAIRS:
        a, b = _report(stores, slow), _report(stores, fast)
        fix, undo = diff_reports(a, b), diff_reports(b, a)
        assert fix["pace"]["faster"] and not undo["pace"]["faster"], slow
        assert undo["regressions"] and not [r for r in undo["rows"] if r["faster"]], slow
        waived = {r["metric"] for r in fix["rows"] if r["faster"]}
        assert not {m for m in waived if m.startswith("busbw") or "memory" in m}, slow
        assert {r["metric"] for r in fix["regressions"]} <= {"peak_gpu_memory_gib"}, (slow, fix["regressions"])


def test_the_pace_gap_floor_is_the_two_sample_test_on_the_steps(stores: Stores, tmp_path: Path) -> None:
    """The smallest pace difference told apart, from plain sqlite3's steps of the HF Trainer pair:
    2 standard errors of the difference of the two means, each step spread 1.4826 x its median
    absolute deviation, the steps one-off in either run left out."""
    a, b = _report(stores, "loops-hf_epochs_np"), _report(stores, "loops-hf_epochs_p")
    sa, sb = _steps("hf_epochs_np", tmp_path), _steps("hf_epochs_p", tmp_path)
    once = _long(sa) | _long(sb)

    def spread(steps: dict[int, float]) -> tuple[float, int]:
        v = [ms for k, ms in steps.items() if k not in once]
        med = statistics.median(v)
        return 1.4826 * statistics.median(abs(x - med) for x in v), len(v)

    (sig_a, na), (sig_b, nb) = spread(sa), spread(sb)
    floor = 2 * (sig_a ** 2 / na + sig_b ** 2 / nb) ** 0.5
    got = diff_reports(a, b)["pace"]
    assert got["noise_ms"] == pytest.approx(floor, abs=0.01) and got["faster"]


def test_orch_diff_exits_0_after_a_fix_and_1_when_it_is_undone(stores: Stores, tmp_path: Path) -> None:
    paths = {}
    for case in ("pairs-ddp4-slow-loader", "pairs-ddp4-healthy"):
        paths[case] = tmp_path / f"{case}.json"
        paths[case].write_text(_report(stores, case).model_dump_json())
    fix = run_orch("diff", str(paths["pairs-ddp4-slow-loader"]), str(paths["pairs-ddp4-healthy"]))
    assert fix.returncode == 0 and "0 regression(s)" in fix.stdout, fix.stdout + fix.stderr
    assert "B faster" in fix.stdout and "B is faster: a step 166.951 -> 58.706 ms (-64.8 %" in fix.stdout
    undo = run_orch("diff", str(paths["pairs-ddp4-healthy"]), str(paths["pairs-ddp4-slow-loader"]))
    assert undo.returncode == 1 and "REGRESSED" in undo.stdout and "B is faster" not in undo.stdout
