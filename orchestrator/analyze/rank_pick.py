"""Which ranks to show when there are too many: one picker for the terminal's rank and thread
tables, the HTML's rank bars, CPU phase bars and memory bars, the memory section's curves, the
timeline's lanes and the trace's rank budget. The heatmaps pick none: they bin every rank.

Every view keeps the ranks that explain the run first (those the findings name, their
victims, the extremes the view cares about), then fills what room is left: an even sample of
the others, or the others in rank order. The views differ only in the parameters: how many
ranks, which ranks come first, and how the rest is filled.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Literal

from orchestrator.analyze.model_report import Report

Fill = Literal["even", "stride", "order", "none"]


def by_findings(report: Report, victims: int | None = None, among: Collection[int] | None = None,
                role: str = "finding") -> list[tuple[int, str]]:
    """Each finding's ranks then its first `victims` victims (None: all), findings by cost; only
    ranks in `among` when given."""
    return [(rk, role) for f in report.findings for rk in (*f.ranks, *f.victims[:victims])
            if among is None or rk in among]


def median_step_rank(report: Report) -> int | None:
    """The rank of median step time (the upper median): the run's typical rank."""
    timed = sorted((m.median_step_ms, m.rank) for m in report.ranks if m.median_step_ms is not None)
    return timed[len(timed) // 2][1] if timed else None


def trace_order(report: Report) -> list[int]:
    """Ranks in the order a trace that cannot hold them all keeps them (export-trace's budget):
    each finding's ranks then its victims (findings come ordered by cost), the rank of median
    step time, rank 0."""
    median = median_step_rank(report)
    order = [rk for rk, _ in by_findings(report)] + ([] if median is None else [median])
    return [*dict.fromkeys([*order, 0])]


def pick_ranks(have: Sequence[int], first: Iterable[tuple[int, str]], limit: int | None = None, *,
               fill: Fill = "even", whole: bool = True,
               fits: Callable[[int, dict[int, str]], bool] | None = None) -> dict[int, str]:
    """rank -> why it is shown, sorted by rank: the ranks of `first` (rank, role) in order, then
    `fill` of the rest of `have`, at most `limit`. `whole`: every rank (in `have`'s order) when
    they fit. `fits(rank, chosen)`: false skips the rank (a budget; true counts it as taken).

    fill: `even`, ranks at i * n / room of the rest; `stride`, at i * max(1, n / room) (the
    timeline's lanes, which may have room for more than the rest); `order`, the rest in order;
    `none`, nothing."""
    if whole and limit is not None and len(have) <= limit:
        return dict.fromkeys(have, "all")
    chosen: dict[int, str] = {}

    def add(rk: int, role: str) -> None:
        if rk not in chosen and (limit is None or len(chosen) < limit) and (fits is None or fits(rk, chosen)):
            chosen[rk] = role

    for rk, role in first:
        add(rk, role)
    rest = [rk for rk in have if rk not in chosen]
    room = len(rest) if limit is None else max(0, limit - len(chosen))
    n = min(room, len(rest))
    if fill == "even" and room:
        picks = [rest[int(i * len(rest) / room)] for i in range(n)]
    elif fill == "stride" and room:
        stride = max(1, len(rest) / room)
        picks = [rest[int(i * stride)] for i in range(n)]
    elif fill == "order":
        picks = rest
    else:
        picks = []
    for rk in picks:
        add(rk, "sample" if fill != "order" else "rest")
    return dict(sorted(chosen.items()))
