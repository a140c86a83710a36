"""The unprofiled_straggler rule on small synthetic tables (fast): which ranks without a report a
profiled rank's excess wait names, from the layout's groups of the communicator's size; what it
costs (the replay's what-if); when it stays quiet. The real capture (DP2 x PP2, ranks 0 and 2
profiled, rank 1's loader slow) is tests/test_gpu_layouts.py's."""

from __future__ import annotations

import pytest

from orchestrator.analyze.model_replay import UNSEEN, Replay, ReplayStep, WhatIf
from orchestrator.analyze.rules.unprofiled_straggler import RULE, groups, members
from tests.rulekit import context, rank

pytestmark = pytest.mark.fast

DP2PP2 = {"known": True, "tp": 1, "pp": 2, "dp": 2, "cp": 1, "ep": 1, "vpp": 1, "microbatches": 4, "world_size": 4}
TP2DP2 = {**DP2PP2, "tp": 2, "pp": 1, "microbatches": None}


def test_the_members_not_profiled_are_those_of_the_layouts_groups_of_the_communicators_size() -> None:
    # DP2 x PP2 (stage = rank // 2): rank 0's 2-rank communicators are its stage's data-parallel
    # pair (0, 1) and its pipeline (0, 2), of which rank 2 is profiled.
    pp, tp = groups(DP2PP2), groups(TP2DP2)
    assert members(pp, 0, 2, {0, 2}) == [1]
    assert members(pp, 2, 2, {0, 2}) == [3]
    assert members(pp, 0, 4, {0, 2}) == [1, 3]
    # TP2 x DP2: rank 0's 2-rank groups are its tensor-parallel pair (0, 1) and its data-parallel
    # pair (0, 2): either may be the communicator, both are named.
    assert members(tp, 0, 2, {0}) == [1, 2]
    # No group of that size: every rank without a report; no layout: nobody can be named.
    assert members(pp, 0, 3, {0, 2}) == [1, 3]
    assert groups({"known": False}) is None and members(None, 0, 2, {0}) == []

def _replay(saving_ms: float, error_ms: float = 1.0) -> Replay:
    steps = [ReplayStep(step=i, measured_ms=100.0, replayed_ms=100.0, error_pct=0.0) for i in range(1, 5)]
    return Replay(steps=steps, error_ms=error_ms, error_pct=0.25, worst_step_pct=0.3,
                  whatifs=[WhatIf(what=UNSEEN, steps=4, saving_ms=saving_ms, saving_pct=saving_ms / 4)])


def _unseen(rk: int, wait_ms: float, ref_ms: float | None) -> dict:
    return {"rank": rk, "comm": "c", "name": "ncclDevKernel_AllGather_RING_LL", "n_ranks": 2, "seen": 1,
            "kernels": 40, "wait_ns": int(wait_ms * 1e6), "ref_ns": None if ref_ms is None else int(ref_ms * 1e6),
            "excess_ns": None if ref_ms is None else int(max(wait_ms - ref_ms, 0) * 1e6)}


def test_a_late_rank_not_profiled_is_named_with_the_replays_saving_and_its_victim() -> None:
    ctx = context([rank(0, window_ms=400.0), rank(2, window_ms=400.0)], layout=DP2PP2, replay=_replay(150.0),
                  tables={"coll_unseen": [_unseen(0, 180.0, 3.0), _unseen(2, 3.0, 180.0)]})
    (f,) = RULE.evaluate(ctx)
    assert (f.kind, f.ranks, f.victims, f.severity, f.cost_ms) == ("unprofiled_straggler", [1], [0], "high", 150.0)
    assert "the lateness of rank(s) 1, not profiled" in f.evidence[0]
    assert f.evidence[-1].startswith("replayed with the ranks not profiled on time")
    # the spec's own words for the ranks to profile next: those profiled and the one named
    assert f.fix.startswith('Profile rank(s) 1 too (profile.ranks: "0-2", or all)')


def test_no_rank_to_compare_with_a_wait_under_one_percent_or_a_saving_within_the_error_names_nobody() -> None:
    # One profiled rank: its wait has no reference (a healthy communicator's members wait by turns).
    alone = context([rank(0, window_ms=400.0)], layout=TP2DP2, replay=_replay(150.0),
                    tables={"coll_unseen": [_unseen(0, 180.0, None)]})
    assert RULE.evaluate(alone) == []
    # An excess under 1 % of the waiting rank's window names no one.
    small = context([rank(0, window_ms=400.0), rank(2, window_ms=400.0)], layout=DP2PP2, replay=_replay(3.0),
                    tables={"coll_unseen": [_unseen(0, 6.0, 3.0), _unseen(2, 3.0, 6.0)]})
    assert RULE.evaluate(small) == []
    # A saving within the replay's error is info.
    (f,) = RULE.evaluate(context([rank(0, window_ms=400.0), rank(2, window_ms=400.0)], layout=DP2PP2,
                                 replay=_replay(0.5), tables={"coll_unseen": [_unseen(0, 30.0, 3.0)]}))
    assert f.severity == "info" and "within the replay's error" in f.evidence[-1]
    # Without the replay's what-if (no job replayed) there is no finding.
    assert RULE.evaluate(context([rank(0)], layout=DP2PP2, tables={"coll_unseen": [_unseen(0, 180.0, 3.0)]})) == []
