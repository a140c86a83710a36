"""The HTML GPU memory section: per rank a bar of its GPU's capacity with the bytes in use at the
window's start, its end and the peak; the growth per step and allocator calls beside it; and
the bytes in use over the capture for the ranks the report kept curves of (one line each)."""

from __future__ import annotations

from html import escape

from orchestrator.analyze.model_gpu_memory import MemoryReport, RankMemory
from orchestrator.analyze.model_report import Report
from orchestrator.analyze.rank_pick import by_findings, pick_ranks

GIB = 2**30
MAX_BARS = 48
PALETTE = ("#1565c0", "#c62828", "#2e7d32", "#6a1b9a", "#ef6c00", "#00838f", "#5d4037", "#ad1457")


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def _gib(b: float | None) -> str:
    return "?" if b is None else f"{b / GIB:.2f}"


def _bar_ranks(report: Report, m: MemoryReport) -> list[RankMemory]:
    """At most MAX_BARS ranks (rank_pick.py): those findings name, the 8 highest and 8 lowest peaks,
    then an even sample of the others."""
    ranks = {r.rank: r for r in m.ranks if r.peak_bytes is not None}
    by_peak = sorted(ranks.values(), key=lambda r: (-(r.peak_bytes or 0), r.rank))
    extremes = [(r.rank, "extreme") for r in by_peak[:8] + by_peak[-8:]]
    return [ranks[rk] for rk in pick_ranks(sorted(ranks), [*by_findings(report, 8, among=ranks), *extremes],
                                           MAX_BARS)]


def _bars(report: Report, m: MemoryReport) -> str:
    ranks = _bar_ranks(report, m)
    if not ranks:
        return ""
    width, bar_h, left, right = 520, 16, 70, 460
    top = max(max((r.capacity_bytes or 0) for r in ranks), max((r.peak_bytes or 0) for r in ranks), 1)
    rows = []
    for i, r in enumerate(ranks):
        y = 20 + i * (bar_h + 6)
        sx = lambda b: left + width * (b or 0) / top  # noqa: E731
        cap = (f'<rect x="{left}" y="{y}" width="{sx(r.capacity_bytes) - left:.1f}" height="{bar_h}" '
               'fill="#eceff1" stroke="#90a4ae"/>' if r.capacity_bytes else "")
        grow = ("" if r.growth_bytes_per_step is None else
                f", {r.growth_bytes_per_step / 2**20:+.1f} MiB/step")
        pct = "" if r.peak_pct is None else f" ({r.peak_pct:.1f} %)"
        label = f"peak {_gib(r.peak_bytes)} GiB{pct}{grow}"
        if r.alloc_calls_per_step:
            label += f", {r.alloc_calls_per_step + (r.free_calls_per_step or 0):.1f} alloc calls/step"
        rows.append(
            f'<text x="4" y="{y + 12}">rank {r.rank}</text>{cap}'
            f'<rect x="{left}" y="{y + 3}" width="{sx(r.peak_bytes) - left:.1f}" height="{bar_h - 6}" fill="#ef9a9a">'
            f"<title>peak {_gib(r.peak_bytes)} GiB</title></rect>"
            f'<rect x="{left}" y="{y + 3}" width="{sx(r.start_bytes) - left:.1f}" height="{bar_h - 6}" fill="#1565c0">'
            f"<title>at the window's start {_gib(r.start_bytes)} GiB</title></rect>"
            f'<line x1="{sx(r.end_bytes):.1f}" x2="{sx(r.end_bytes):.1f}" y1="{y}" y2="{y + bar_h}" stroke="#000" '
            f'stroke-width="2"><title>at the window\'s end {_gib(r.end_bytes)} GiB</title></line>'
            f'<text x="{left + width + 8}" y="{y + 12}">{_e(label)}</text>')
    h = 30 + len(ranks) * (bar_h + 6)
    legend = ('<p class="legend"><span style="background:#1565c0"></span>in use at the window\'s start'
              '<span style="background:#ef9a9a"></span>peak<span style="background:#000;width:3px"></span>end'
              '<span style="background:#eceff1;border:1px solid #90a4ae"></span>GPU capacity</p>')
    return (f'{legend}<svg id="memory-bars" width="{left + width + right}" height="{h}" '
            f'xmlns="http://www.w3.org/2000/svg">{"".join(rows)}</svg>')


def _curves(m: MemoryReport) -> str:
    if not m.curves or len(m.curve_t_ms) < 2:
        return ""
    width, height, left, bottom = 760, 220, 70, 30
    t0, t1 = m.curve_t_ms[0], m.curve_t_ms[-1]
    top = max(max(max(c.bytes) for c in m.curves), 1)
    span = (t1 - t0) or 1.0
    lines, keys = [], []
    for i, c in enumerate(m.curves):
        color = PALETTE[i % len(PALETTE)]
        pts = " ".join(f"{left + width * (t - t0) / span:.1f},{10 + height * (1 - b / top):.1f}"
                       for t, b in zip(m.curve_t_ms, c.bytes, strict=False))
        lines.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}">'
                     f"<title>rank {c.rank}</title></polyline>")
        keys.append(f'<span style="background:{color}"></span>rank {c.rank}')
    axis = (f'<text x="4" y="18">{_gib(top)} GiB</text><text x="4" y="{10 + height}">0</text>'
            f'<text x="{left}" y="{height + bottom}">{t0 / 1e3:.2f} s</text>'
            f'<text x="{left + width - 60}" y="{height + bottom}">{t1 / 1e3:.2f} s</text>')
    return (f'<p class="legend">bytes in use over the capture (highest per bucket): {"".join(keys)}</p>'
            f'<svg id="memory-curves" width="{left + width + 20}" height="{height + bottom + 10}" '
            f'xmlns="http://www.w3.org/2000/svg">{axis}{"".join(lines)}</svg>')


def memory_section(report: Report) -> str:
    m = report.memory
    if m is None:
        return ""
    head = "<h2>GPU memory per rank</h2>"
    if m.source == "none":
        return f'{head}<p class="note">{_e(m.hint or "")}</p>'
    spread = ""
    if len(m.ranks) > 1 and m.peak_rank is not None:
        spread = (f"<p>Highest peak: rank {_e(m.peak_rank)} ({_gib(m.max_peak_bytes)} GiB); peaks across "
                  f"{len(m.ranks)} ranks span {_gib(m.spread_bytes)} GiB (median {_gib(m.median_peak_bytes)} GiB).</p>")
    return f'{head}{spread}{_bars(report, m)}{_curves(m)}<p class="note">{_e(m.baseline)}</p>'
