"""Rank x step heatmaps that stay readable from 2 to thousands of ranks.

Up to `MAX_ROWS` ranks get one row each with a label. Beyond that, consecutive ranks are
binned into at most `MAX_ROWS` rows, each coloured by the WORST rank of its bin (a straggler
must not be averaged away) and titled with that rank; steps are binned the same way past
`MAX_COLS`. The colour scale is set by the steady-state cells: warm-up cells (usually far
slower) saturate instead of washing everything else out. Hover titles give exact values.
"""

from __future__ import annotations

import math
import statistics
from html import escape

MAX_ROWS = 64
MAX_COLS = 80
# A perceptual sequential palette (viridis stops): dark = low, yellow = high.
VIRIDIS = ["#440154", "#3b528b", "#21918c", "#5ec962", "#fde725"]
PURPLES = ["#f2f0f7", "#cbc9e2", "#9e9ac8", "#756bb1", "#54278f"]


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def _lerp(stops: list[str], t: float) -> str:
    t = min(1.0, max(0.0, t)) * (len(stops) - 1)
    i = min(int(t), len(stops) - 2)
    f = t - i
    a, b = stops[i], stops[i + 1]
    rgb = [round(int(a[k:k + 2], 16) * (1 - f) + int(b[k:k + 2], 16) * f) for k in (1, 3, 5)]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def _bins(items: list[int], limit: int) -> list[list[int]]:
    size = max(1, math.ceil(len(items) / limit))
    return [items[i:i + size] for i in range(0, len(items), size)]


def _span(group: list[int], word: str) -> str:
    return f"{word} {group[0]}" if len(group) == 1 else f"{word}s {group[0]}-{group[-1]}"


def heatmap(svg_id: str, values: dict[int, dict[int, float]], warmup: set[tuple[int, int]], *,
            what: str, palette: list[str] | None = None, least: bool = False) -> str:
    """SVG heatmap of `values` (rank -> step -> ms); `warmup` cells are marked and left out of the scale.
    A binned cell shows its highest value, or with `least` its lowest (for waiting: the rank
    that waits least is the one the others wait for)."""
    ranks = sorted(values)
    steps = sorted({s for by in values.values() for s in by})
    if not ranks or not steps:
        return f"<p>No {_e(what)} per step: no heatmap.</p>"
    palette = palette or VIRIDIS
    vals = [v for rk in ranks for s, v in values[rk].items() if (rk, s) not in warmup] or [
        v for rk in ranks for v in values[rk].values()]
    lo, hi = min(vals), max(vals)
    rows, cols = _bins(ranks, MAX_ROWS), _bins(steps, MAX_COLS)
    cw = max(6, min(40, 760 // len(cols)))
    ch = 14 if len(rows) <= 32 else 10
    left, top = 96, 18
    out = []
    every = max(1, math.ceil(28 / cw))  # a step label every ~28 px
    for j, cg in enumerate(cols):
        if j % every == 0:
            out.append(f'<text x="{left + j * cw + 1}" y="12">{_e(cg[0])}</text>')
    for i, rg in enumerate(rows):
        y = top + i * ch
        if len(rows) <= 32 or i % 2 == 0:
            out.append(f'<text x="0" y="{y + ch - 3}">{_e(_span(rg, "rank"))}</text>')
        for j, cg in enumerate(cols):
            cell = [(values[rk][s], rk, s) for rk in rg for s in cg if s in values[rk]]
            if not cell:
                continue
            v, wrk, wst = min(cell) if least else max(cell)
            warm = all((rk, s) in warmup for _, rk, s in cell)
            t = (v - lo) / (hi - lo) if hi > lo else 0.0
            note = " (warm-up, not in the scale)" if warm else ""
            if len(cell) > 1:
                med = statistics.median(c[0] for c in cell)
                most = "least" if least else "most"
                label = (f"{_span(rg, 'rank')}, {_span(cg, 'step')}: {most} {v:.3f} ms (rank {wrk} step {wst}), "
                         f"median {med:.3f} ms over {len(cell)} cells{note}")
            else:
                label = f"rank {wrk} step {wst}: {v:.3f} ms{note}"
            stroke = ' stroke="#888" stroke-dasharray="2,1"' if warm else ""
            out.append(f'<rect class="cell" data-rank="{_e(wrk)}" data-step="{_e(wst)}" data-n="{len(cell)}" '
                       f'x="{left + j * cw}" y="{y}" width="{cw - 1}" height="{ch - 1}" '
                       f'fill="{_lerp(palette, t)}"{stroke}><title>{_e(label)}</title></rect>')
    shows = "the rank of its bin with the least (the one the others wait for)" if least else "its worst rank"
    binned = (f" Ranks binned {len(rows[0])} per row, steps {len(cols[0])} per column; each cell shows {shows}."
              if len(rows[0]) > 1 or len(cols[0]) > 1 else "")
    scale = "".join(f'<span style="background:{_lerp(palette, k / 4)}"></span>' for k in range(5))
    return (f'<svg id="{_e(svg_id)}" class="heatmap" width="{left + len(cols) * cw + 10}" '
            f'height="{top + len(rows) * ch + 6}" data-ranks="{len(ranks)}" data-steps="{len(steps)}">'
            f'{"".join(out)}</svg><p class="legend">{_e(what)} per step: {lo:.1f} ms {scale} {hi:.1f} ms; '
            f"dashed cells are warm-up steps.{_e(binned)}</p>")
