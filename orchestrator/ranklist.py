"""How a set of ranks is written in titles, evidence and pages: as ranges, so that the 2,047
victims of one late rank in a 2,048-rank job are one short line, not 2,047 numbers."""

from __future__ import annotations

from collections.abc import Iterable


def runs(ranks: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted distinct ranks as (first, last) runs of consecutive numbers."""
    out: list[tuple[int, int]] = []
    for r in sorted(set(ranks)):
        if out and r == out[-1][1] + 1:
            out[-1] = (out[-1][0], r)
        else:
            out.append((r, r))
    return out


def ranges(ranks: Iterable[int], most: int | None = 12) -> str:
    """'0-3, 5, 7-9'; past `most` runs (None: no limit) the first ones and how many ranks
    there are in all."""
    rs = runs(ranks)
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in rs[:most])
    if most is not None and len(rs) > most:
        text += f", … ({sum(b - a + 1 for a, b in rs):,} ranks)"
    return text
