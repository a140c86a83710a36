"""Which global ranks get profiled, and which profiled rank collects GPU metrics per node.

Everything is resolved to explicit rank sets here, once, so the rendered wrapper, the
manifest's expected reports and `orch collect` all agree on the same list.
"""

from __future__ import annotations

import re

from orchestrator.errors import OrchError

SELECTORS = ("all", "none", "first-per-node", "one-per-stage")
_RANGE_RE = re.compile(r"^\s*(\d{1,9})\s*(?:-\s*(\d{1,9})\s*)?$")


def parse_rank_list(text: str, world: int, field: str = "profile.ranks") -> list[int]:
    """Parse '0,8-15' into sorted unique ranks, each checked against the world size."""
    ranks: set[int] = set()
    for part in text.split(","):
        m = _RANGE_RE.match(part)
        if not m:
            raise OrchError(
                f"{field}: {part.strip()!r} is not a rank or range; use e.g. '0,8-15' "
                f"or one of {', '.join(SELECTORS)}"
            )
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise OrchError(f"{field}: range {lo}-{hi} is reversed; write {hi}-{lo}")
        if hi >= world:
            raise OrchError(
                f"{field}: rank {hi} is outside the world size {world} "
                f"(ranks 0-{world - 1}); lower it or raise nodes/nproc_per_node"
            )
        ranks.update(range(lo, hi + 1))
    return sorted(ranks)


def select_ranks(
    selector: str | int | list[int], *, world: int, nproc_per_node: int, stage_size: int | None
) -> list[int]:
    """Resolve `profile.ranks` to explicit global ranks (static rendezvous order)."""
    if isinstance(selector, bool):
        raise OrchError("profile.ranks: use 'all' or 'none', not true/false")
    if isinstance(selector, int):
        selector = str(selector)
    if isinstance(selector, list):
        selector = ",".join(str(r) for r in selector)
        if not selector:
            raise OrchError("profile.ranks: empty list; use 'none' to profile no rank")
    sel = selector.strip()
    if sel == "all":
        return list(range(world))
    if sel == "none":
        return []
    if sel == "first-per-node":
        return list(range(0, world, nproc_per_node))
    if sel == "one-per-stage":
        if stage_size is None:
            raise OrchError(
                "profile.ranks: one-per-stage needs the parallel layout; "
                "set layout.pp (and tp/dp) in the job spec"
            )
        return list(range(0, world, stage_size))
    return parse_rank_list(sel, world)


def collector_ranks(profiled: list[int], nproc_per_node: int) -> list[int]:
    """The lowest profiled rank of each node: nsys allows one GPU-metrics sampler per GPU,
    so exactly one process per node samples all of the node's GPUs."""
    first: dict[int, int] = {}
    for r in profiled:
        first.setdefault(r // nproc_per_node, r)
    return sorted(first.values())


def to_ranges(ranks: list[int]) -> list[tuple[int, int]]:
    """Compress sorted ranks into inclusive (lo, hi) ranges for a compact shell test."""
    out: list[tuple[int, int]] = []
    for r in ranks:
        if out and r == out[-1][1] + 1:
            out[-1] = (out[-1][0], r)
        else:
            out.append((r, r))
    return out


def format_ranges(ranks: list[int]) -> str:
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in to_ranges(ranks)) or "none"
