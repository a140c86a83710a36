"""CPU-only captures in the HTML report: phase bars and the per-rank CPU table.

Without GPU activity the comparison is the CPU self time per step in each NVTX range
(`Report.cpu_phases`): one stacked bar per rank, one colour per range, so the rank whose
`data_load` is long and the rank whose `backward` absorbs the wait stand side by side.
"""

from __future__ import annotations

import statistics
from html import escape

from orchestrator.analyze.model_report import Report
from orchestrator.analyze.model_timeline import Extras
from orchestrator.analyze.rank_pick import by_findings, pick_ranks
from orchestrator.report.timeline_svg import nvtx_color

MAX_BARS = 48


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def _phases(report: Report) -> tuple[list[str], list[int], dict[tuple[int, str], float]]:
    ranges = sorted({c.range for c in report.cpu_phases})
    ranks = sorted({c.rank for c in report.cpu_phases})
    return ranges, ranks, {(c.rank, c.range): c.ms_per_step for c in report.cpu_phases}


def phase_bars(report: Report) -> str:
    ranges, ranks, val = _phases(report)
    if not ranges:
        return "<p>No NVTX ranges inside the steps: no CPU phases to compare.</p>"
    # At most MAX_BARS ranks (rank_pick.py): those findings name, the 8 with the most CPU time per
    # step in ranges and the 8 with the least, then an even sample of the others.
    tot = sorted(ranks, key=lambda rk: (-sum(val.get((rk, r), 0.0) for r in ranges), rk))
    ranks = list(pick_ranks(ranks, [*by_findings(report, 8, among=set(ranks)),
                                    *((rk, "extreme") for rk in tot[:8] + tot[-8:])], MAX_BARS))
    width, bar_h, left = 640, 18, 70
    top = max(sum(val.get((rk, r), 0.0) for r in ranges) for rk in ranks) or 1
    rows = []
    for i, rk in enumerate(ranks):
        x, y = left, 10 + i * (bar_h + 6)
        rows.append(f'<text x="0" y="{y + 13}">rank {_e(rk)}</text>')
        for r in ranges:
            ms = val.get((rk, r), 0.0)
            w = width * ms / top
            rows.append(f'<rect class="phase" data-rank="{_e(rk)}" data-range="{_e(r)}" x="{x:.1f}" y="{y}" '
                        f'width="{w:.1f}" height="{bar_h}" fill="{nvtx_color(r)}" stroke="#fff" stroke-width="0.5">'
                        f"<title>rank {_e(rk)} {_e(r)}: {ms:.3f} ms per step (self time)</title></rect>")
            x += w
        total = sum(val.get((rk, r), 0.0) for r in ranges)
        rows.append(f'<text x="{x + 4:.1f}" y="{y + 13}">{total:.1f} ms</text>')
    legend = "".join(f'<span style="background:{nvtx_color(r)}"></span>{_e(r)}' for r in ranges)
    return (f'<div class="legend">CPU self time per step by NVTX range: {legend}</div>'
            f'<svg id="phase-bars" width="{left + width + 70}" height="{20 + len(ranks) * (bar_h + 6)}" '
            f'role="img">{"".join(rows)}</svg>')


def cpu_table(report: Report, extras: Extras | None) -> str:
    ranges, _, val = _phases(report)
    steps = (extras or Extras()).cpu_step_ms
    first = (extras or Extras()).first_step
    head = "".join(f"<th>{_e(r)} ms</th>" for r in ranges)
    rows = []
    for r in report.ranks:
        by = {s: ms for s, ms in steps.get(r.rank, {}).items() if s != first.get(r.rank)}
        med = f"{statistics.median(by.values()):.3f}" if by else ""
        cells = "".join(f"<td>{val[(r.rank, g)]:.3f}</td>" if (r.rank, g) in val else "<td></td>" for g in ranges)
        rows.append(f"<tr><td>{_e(r.rank)}</td><td>{_e(r.host or '')}</td><td>{med}</td>{cells}</tr>")
    return (f'<h2>Metrics (CPU)</h2><table id="metrics"><tr><th>rank</th><th>host</th><th>median step ms</th>'
            f"{head}</tr>{''.join(rows)}</table>")
