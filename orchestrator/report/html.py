"""One self-contained HTML file (inline SVG, CSS and the tables' sort script, no network).

Plots: per-rank stacked bars (compute / exposed NCCL transfer / NCCL waiting for another rank /
other GPU work / idle), a rank x step
heatmap of GPU step time, stage compute bars; tables: findings, top gaps by CPU range.
Every user- or trace-derived string goes through html.escape.
"""

from __future__ import annotations

from html import escape

from orchestrator.analyze.model import Report
from orchestrator.report.tables_html import stats_html

COLORS = {"compute": "#2e7d32", "comm transfer": "#c62828", "comm waiting": "#8e24aa", "other GPU": "#f9a825",
          "idle": "#cfd8dc"}
CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222}h2{margin-top:28px}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}
.sev-high{color:#b71c1c;font-weight:bold}.sev-medium{color:#e65100}.sev-low{color:#01579b}
.sev-info{color:#1b5e20}.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}
svg text{font-size:11px}"""


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def rank_bars(report: Report) -> str:
    ranks = report.ranks
    width, bar_h, left = 640, 18, 70
    top = max((r.window_ms for r in ranks), default=0) or 1
    rows = []
    for i, r in enumerate(ranks):
        # NCCL time outside compute, split into waiting for another rank and moving data.
        waiting = min(r.exposed_comm_ms, r.nccl_wait_ms + r.p2p_wait_ms)
        other = max(0.0, r.gpu_busy_ms - r.compute_ms - r.exposed_comm_ms)
        parts = [("compute", r.compute_ms), ("comm transfer", r.exposed_comm_ms - waiting), ("comm waiting", waiting),
                 ("other GPU", other), ("idle", max(0.0, r.window_ms - r.gpu_busy_ms))]
        x, y = left, 10 + i * (bar_h + 6)
        rows.append(f'<text x="0" y="{y + 13}">rank {_e(r.rank)}</text>')
        for name, ms in parts:
            w = width * ms / top
            rows.append(f'<rect class="seg" data-rank="{_e(r.rank)}" data-part="{_e(name)}" x="{x:.1f}" '
                        f'y="{y}" width="{w:.1f}" height="{bar_h}" fill="{COLORS[name]}">'
                        f"<title>rank {_e(r.rank)} {name}: {ms:.3f} ms</title></rect>")
            x += w
    h = 20 + len(ranks) * (bar_h + 6)
    legend = "".join(f'<span style="background:{c}"></span>{_e(n)}' for n, c in COLORS.items())
    return (f'<div class="legend">{legend}</div><svg id="rank-bars" width="{left + width + 10}" '
            f'height="{h}" role="img">{"".join(rows)}</svg>')


def step_heatmap(report: Report) -> str:
    steps = report.steps
    ranks = [r.rank for r in report.ranks]
    if not steps or not ranks:
        return "<p>No step ranges: no heatmap.</p>"
    # Color by the steady-state steps; warm-up steps (often much slower) saturate at red.
    vals = [v for s in steps if not s.warmup for v in s.ms_by_rank.values()] or [
        v for s in steps for v in s.ms_by_rank.values()]
    lo, hi = min(vals), max(vals)
    cw, ch, left = max(12, min(40, 700 // len(steps))), 16, 70
    cells = []
    for j, s in enumerate(steps):
        cells.append(f'<text x="{left + j * cw + 2}" y="12">{_e(s.step)}</text>')
        for i, rk in enumerate(ranks):
            v = s.ms_by_rank.get(str(rk))
            if v is None:
                continue
            t = min(1.0, (v - lo) / (hi - lo)) if hi > lo else 0.0
            color = f"rgb({int(255 * t)},{int(80 + 120 * (1 - t))},{int(200 * (1 - t))})"
            cells.append(f'<rect class="cell" x="{left + j * cw}" y="{18 + i * ch}" width="{cw - 1}" '
                         f'height="{ch - 1}" fill="{color}"><title>rank {_e(rk)} step {_e(s.step)}: '
                         f'{v:.3f} ms{" (warm-up)" if s.warmup else ""}</title></rect>')
    labels = "".join(f'<text x="0" y="{18 + i * ch + 12}">rank {_e(rk)}</text>' for i, rk in enumerate(ranks))
    return (f'<svg id="step-heatmap" width="{left + len(steps) * cw + 10}" height="{24 + len(ranks) * ch}">'
            f"{labels}{''.join(cells)}</svg><p>GPU time per step: {lo:.1f} ms (blue) to {hi:.1f} ms (red).</p>")


def stage_bars(report: Report) -> str:
    stages = report.stages
    if not stages:
        return "<p>No layout given: no stage view (pass --layout pp=N).</p>"
    top = max(s.compute_ms for s in stages) or 1
    bars = []
    for i, s in enumerate(stages):
        w = 500 * s.compute_ms / top
        bars.append(f'<text x="0" y="{i * 24 + 15}">stage {_e(s.stage)}</text>'
                    f'<rect class="stage" x="70" y="{i * 24 + 2}" width="{w:.1f}" height="18" fill="#3949ab">'
                    f"<title>stage {_e(s.stage)}: {s.compute_ms} ms compute, bubble {s.bubble_pct}%"
                    f'</title></rect><text x="{75 + w:.1f}" y="{i * 24 + 15}">{s.compute_ms:.1f} ms</text>')
    return f'<svg id="stage-bars" width="700" height="{len(stages) * 24 + 8}">{"".join(bars)}</svg>'


def render_html(report: Report) -> str:
    f_rows = "".join(
        f'<tr><td class="sev-{_e(f.severity)}">{_e(f.severity)}</td><td>{_e(f.title)}</td>'
        f'<td>{_e(", ".join(map(str, f.ranks)))}</td><td><ul>'
        + "".join(f"<li>{_e(e)}</li>" for e in f.evidence) + f"</ul></td><td>{_e(f.fix)}</td></tr>"
        for f in report.findings
    )
    g_rows = "".join(
        f"<tr><td>{_e(r.rank)}</td><td>{_e(name)}</td><td>{ms:.3f}</td></tr>"
        for r in report.ranks for name, ms in r.gaps_by_range_ms.items()
    ) or '<tr><td colspan="3">no GPU gaps above the threshold</td></tr>'
    m_rows = "".join(
        "<tr>" + "".join(f"<td>{_e('' if getattr(r, k) is None else getattr(r, k))}</td>" for k in (
            "rank", "host", "stage", "window_ms", "compute_ms", "comm_ms", "comm_overlap_pct",
            "exposed_comm_ms", "gpu_idle_pct", "nccl_wait_ms", "p2p_wait_ms", "late_count")) + "</tr>"
        for r in report.ranks
    )
    problems = "".join(f"<li>rank {_e(p.rank)}: {_e(p.status)} {_e(p.reason or '')}</li>"
                       for p in report.problems)
    w = report.window
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>orch report</title><style>{CSS}</style></head>
<body><h1>orch cross-rank report</h1>
<p>Window: {_e(w.note)}; steps from {_e(w.step_source)}; gaps &ge; {_e(w.gap_ms)} ms. Store: {_e(report.store)}</p>
{f'<h2>Problems</h2><ul id="problems">{problems}</ul>' if problems else ''}
<h2>Findings</h2><table id="findings"><tr><th>severity</th><th>finding</th><th>ranks</th>
<th>evidence</th><th>fix</th></tr>{f_rows}</table>
{stats_html(report)}
<h2>Per-rank GPU time</h2>{rank_bars(report)}
<h2>Step time per rank</h2>{step_heatmap(report)}
<h2>Stages</h2>{stage_bars(report)}
<h2>GPU gaps by CPU range (ms)</h2><table id="gaps"><tr><th>rank</th><th>range</th><th>ms</th></tr>{g_rows}</table>
<h2>Metrics</h2><table id="metrics"><tr><th>rank</th><th>host</th><th>stage</th><th>window ms</th>
<th>compute ms</th><th>comm ms</th><th>overlap %</th><th>exposed comm ms</th><th>GPU idle %</th>
<th>NCCL wait ms</th><th>p2p wait ms</th><th>late</th></tr>{m_rows}</table>
</body></html>
"""
