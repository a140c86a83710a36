"""Reports that look like they come from different jobs: a warning naming the ranks.

Merging two jobs' reports (a stale report left in the folder, two runs copied together)
gives numbers that mean nothing, with status ok. Capture metadata tells them apart: the
captured command line, WORLD_SIZE, and session starts far apart. This never drops a rank
(an MPMD job may run different commands); it says which ranks disagree so the user can look.
"""

from __future__ import annotations

from collections import defaultdict

from orchestrator import numbers
from orchestrator.collect.member import Member

MAX_START_SPREAD_NS = 3600 * 10**9  # ranks of one job start within minutes; an hour is another job


def _ranks(ms: list[Member]) -> str:
    shown = sorted(m.rank for m in ms if m.rank is not None)
    text = ", ".join(str(r) for r in shown[:8]) + (f", ... ({len(shown)} ranks)" if len(shown) > 8 else "")
    return text or ", ".join(m.report.origin.name for m in ms[:3])


def _split(what: str, groups: dict[object, list[Member]]) -> str | None:
    if len(groups) < 2:
        return None
    parts = sorted(groups.values(), key=lambda ms: (-len(ms), _ranks(ms)))
    return (f"ranks come from different jobs? {what} differs: "
            + " vs ".join(f"ranks {_ranks(ms)}" for ms in parts[:4]))


def job_warnings(members: list[Member]) -> list[str]:
    live = [m for m in members if not m.probe.error and m.status == "ok"]
    by_cmd: dict[object, list[Member]] = defaultdict(list)
    by_world: dict[object, list[Member]] = defaultdict(list)
    for m in live:
        if m.probe.command:
            by_cmd[m.probe.command].append(m)
        world, bad = numbers.optional(numbers.rank, m.probe.env.get("WORLD_SIZE"), "WORLD_SIZE")
        if world is not None and not bad:
            by_world[world].append(m)
    out = [w for w in (_split("the captured command line", by_cmd),
                       _split("the captured WORLD_SIZE", by_world)) if w]
    starts = sorted(((m.probe.session_start_ns, m) for m in live if m.probe.session_start_ns is not None),
                    key=lambda sm: sm[0])
    if starts and starts[-1][0] - starts[0][0] > MAX_START_SPREAD_NS:
        hours = (starts[-1][0] - starts[0][0]) / 3.6e12
        out.append(f"ranks come from different jobs? session starts are {hours:.1f} h apart "
                   f"(rank {_ranks([starts[0][1]])} earliest, rank {_ranks([starts[-1][1]])} latest)")
    return out
