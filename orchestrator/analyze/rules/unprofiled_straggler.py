"""Ranks without a report that hold up the profiled ones in their collectives.

With `profile.ranks` choosing a few ranks (one per stage, a node), a profiled rank's collective
whose communicator has members without a report matches no instance: its wait reads as the
rank's own work, and the critical path among the profiled ranks starts at a victim. NCCL's own
count of the communicator's members (its init payload) says members are missing; the wait is
each kernel's length less its transfer (61_replay.sql, coll_unseen). A wait is no one's lateness
by itself: members of a healthy communicator wait for each other by turns. What the members
without a report are late by is the excess over what the other profiled ranks wait in
communicators of the same size and kernel; a rank with nobody to compare with says nothing.
Which ranks those members are: the layout's groups of the communicator's size that hold the
waiting rank (its stage's data-parallel ranks, its tensor-parallel ranks, its pipeline), less
the profiled ranks. What having them on time saves is the replay's `ranks not profiled on time`
(the excess out of the profiled ranks' own work); within the replay's error it is `info`.
The pipeline bubble's excess these waits make is then this finding's (pipeline_bubble.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.analyze.model_replay import UNSEEN
from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding
from orchestrator.analyze.units import ms
from orchestrator.layout import Layout
from orchestrator.ranklist import ranges

FIX = ("Profile rank(s) {ranks} too (profile.ranks: \"{spec}\", or all) to see what they do while the others "
       "wait, and fix that first: their collectives' waits are all this capture holds of them.")


def groups(layout: dict) -> Callable[[int], list[list[int]]] | None:
    """The layout's groups that hold a rank (its stage's data-parallel ranks, its tensor-parallel
    ranks, its pipeline, the world), placed once for every rank; None without a known layout."""
    world = layout.get("world_size")
    if not layout.get("known") or not isinstance(world, int):
        return None
    lay = Layout(**{k: v for k, v in layout.items() if k in Layout.model_fields})
    place = [lay.place(r) for r in range(world)]
    keys = (("stage", "tp_index"), ("stage", "dp_index"), ("dp_index", "tp_index"))
    by: dict[tuple, list[int]] = defaultdict(list)
    for r, pl in enumerate(place):
        for i, k in enumerate(keys):
            by[(i, *(pl[x] for x in k))].append(r)
    return lambda rank: [by[(i, *(place[rank][x] for x in k))] for i, k in enumerate(keys)] + [list(range(world))]


def members(of: Callable[[int], list[list[int]]] | None, rank: int, size: int, profiled: set[int]) -> list[int]:
    """The ranks without a report that can be the other members of a communicator of `size`
    holding `rank`: those of its layout groups of that size (`groups`) less the profiled ranks;
    every rank without a report where no group has that size; none without a layout."""
    if of is None:
        return []
    held = of(rank)
    fits = {r for g in held if len(g) == size for r in g} - profiled
    return sorted(fits if fits else set(held[-1]) - profiled)


@dataclass
class UnprofiledStraggler(Rule):
    kind = "unprofiled_straggler"
    root = True
    reads = ("coll_unseen",)
    # A communicator's excess wait names its members without a report from this share of the
    # waiting rank's window (the severity scale's `low`): below it, the turns members wait by.
    min_share: float = 0.01

    def evaluate(self, ctx: Context) -> list[Finding]:
        replay = ctx.report.replay
        on_time = replay.removed(UNSEEN) if replay else None
        if on_time is None:
            return []
        profiled = {r.rank for r in ctx.report.ranks}
        late: dict[int, float] = defaultdict(float)  # rank without a report -> the excess it may cause
        waited: dict[int, list[str]] = defaultdict(list)
        win, of = ctx.window_ms(), groups(ctx.report.layout)
        for c in ctx.views.rows("coll_unseen"):
            if c["excess_ns"] is None or not win.get(c["rank"]) or ms(c["excess_ns"]) < self.min_share * win[c["rank"]]:
                continue
            who = members(of, c["rank"], c["n_ranks"], profiled)
            if not who:  # no layout: which ranks are missing is unknown
                continue
            for r in who:
                late[r] += c["excess_ns"]
            waited[c["rank"]].append(
                f"rank {c['rank']}: {ms(c['wait_ns'])} ms waiting in {c['kernels']} `{c['name']}` of a communicator "
                f"of {c['n_ranks']} ranks, {c['seen']} of them profiled, where the other profiled ranks wait "
                f"{ms(c['ref_ns'])} ms in theirs: {ms(c['excess_ns'])} ms more, the lateness of rank(s) "
                f"{ranges(who)}, not profiled")
        if not late:
            return []
        ranks = sorted(late)
        evidence = [line for rk in sorted(waited) for line in waited[rk]]
        evidence.append(f"replayed with the ranks not profiled on time (that excess out of the profiled ranks' own "
                        f"work), the {on_time.steps} steps take {on_time.change}; the replay of the unchanged trace "
                        f"is within {replay.error_pct}% of it")
        cost = max(on_time.saving_ms, 0.0)
        info = cost <= replay.error_ms
        if info:
            evidence.append(f"that saving is within the replay's error ({replay.error_ms} ms)")
        title = (f"rank(s) {ranges(ranks)}, not profiled, hold up rank(s) {ranges(sorted(waited))} in their "
                 "collectives")
        fix = FIX.format(ranks=ranges(ranks), spec=ranges(sorted(profiled | late.keys())).replace(" ", ""))
        return [finding(self.kind, ranks, title, evidence, fix, cost, pct=max(on_time.saving_pct, 0.0),
                        severity="info" if info else None, victims=sorted(waited))]


RULE = UnprofiledStraggler()
