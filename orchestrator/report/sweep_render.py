"""`orch sweep` results side by side: a terminal table and a self-contained HTML page.

One row per value (or combination): median step time and its ratio to the best, GPU idle,
waiting for other ranks per step, the top finding and where the job's own report is. The
best (lowest median step time) is named in a sentence, not only highlighted, so it survives
copy-paste into a ticket. GPU columns are left out when no job captured GPU activity.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from orchestrator.analyze.model_sweep import Point, Sweep
from orchestrator.report.safe import cell, plain


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def _num(v: float | None, fmt: str = ".1f") -> str:
    return "" if v is None else format(v, fmt)


def _ratio(p: Point, best: Point | None) -> str:
    if p.step_ms is None or best is None or not best.step_ms:
        return ""
    return f"{p.step_ms / best.step_ms:.2f}x"


def best_line(s: Sweep) -> str:
    if s.best is None:
        return "no job of the sweep finished with step times: no best value"
    b = s.points[s.best]
    return f"best: {b.label} (median step {b.step_ms:.1f} ms, job {b.job_id})"


def print_sweep(s: Sweep, console: Console) -> None:
    t = Table(title=f"sweep of {', '.join(s.keys)}", box=box.SIMPLE_HEAD, show_edge=False, title_justify="left")
    cols = ["value", "job", "state", "step ms", "vs best"] + (["GPU idle %", "wait ms/step"] if s.gpu else []) + [
        "top finding"]
    for c in cols:
        t.add_column(c, justify="right" if c in ("step ms", "vs best", "GPU idle %", "wait ms/step") else "left",
                     max_width=40 if c == "top finding" else None, overflow="ellipsis", no_wrap=c == "top finding")
    best = s.points[s.best] if s.best is not None else None
    for i, p in enumerate(s.points):
        row = [cell(p.label) + (" *" if i == s.best else ""), cell(p.job_id or ""), cell(p.state),
               _num(p.step_ms), _ratio(p, best)]
        if s.gpu:
            row += [_num(p.gpu_idle_pct), _num(p.waiting_ms_per_step, ".2f")]
        row.append(cell(p.top_finding or p.error or ""))
        t.add_row(*row)
    console.print(t)
    for n in s.notes:
        console.print(plain(n), markup=False, highlight=False)
    console.print(plain(best_line(s)), markup=False, highlight=False)


def render_sweep_html(s: Sweep, out: Path | None = None) -> str:
    """The page; report links are relative to `out` when it is given."""
    best = s.points[s.best] if s.best is not None else None
    top = max((p.step_ms or 0.0 for p in s.points), default=0.0) or 1.0
    rows, bars = [], []
    for i, p in enumerate(s.points):
        link = ""
        if p.report_html:
            href = Path(p.report_html)
            if out is not None:
                try:
                    href = href.relative_to(out.parent.resolve())
                except ValueError:
                    href = href.resolve()
            link = f'<a href="{_e(href.as_posix())}">report</a>'
        cls = ' class="best"' if i == s.best else ""
        gpu = (f"<td>{_num(p.gpu_idle_pct)}</td><td>{_num(p.waiting_ms_per_step, '.2f')}</td>" if s.gpu else "")
        rows.append(f"<tr{cls} data-value=\"{_e(p.label)}\"><td>{_e(p.label)}</td><td>{_e(p.job_id or '')}</td>"
                    f"<td>{_e(p.state)}</td><td class=\"step\">{_num(p.step_ms)}</td><td>{_ratio(p, best)}</td>{gpu}"
                    f"<td>{_e(p.top_finding or p.error or '')}</td><td>{link}</td></tr>")
        w = 520 * (p.step_ms or 0.0) / top
        color = "#2e7d32" if i == s.best else "#90a4ae"
        bars.append(f'<text x="0" y="{i * 24 + 15}">{_e(p.label[:28])}</text><rect class="sweep-bar" '
                    f'x="200" y="{i * 24 + 2}" width="{w:.1f}" height="18" fill="{color}"><title>{_e(p.label)}: '
                    f'{_num(p.step_ms)} ms median step</title></rect><text x="{205 + w:.1f}" y="{i * 24 + 15}">'
                    f"{_num(p.step_ms)} ms</text>")
    gpu_head = "<th>GPU idle %</th><th>waiting ms/step</th>" if s.gpu else ""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>orch sweep</title><style>
body{{font-family:system-ui,sans-serif;margin:24px;color:#222}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;font-size:13px}}tr.best td{{background:#e8f5e9;font-weight:bold}}
svg text{{font-size:11px}}#best{{border-left:6px solid #2e7d32;background:#f1f8e9;padding:8px 14px}}
</style></head><body><h1>orch sweep: {_e(", ".join(s.keys))}</h1><p>Job spec: {_e(s.job)}. One job per value,
run one after another; step time = per step the slowest rank, median over the steady steps.</p>
{"".join(f"<p>{_e(n)}</p>" for n in s.notes)}<p id="best">{_e(best_line(s))}</p>
<svg id="sweep-bars" width="800" height="{len(s.points) * 24 + 8}">{"".join(bars)}</svg>
<table id="sweep"><tr><th>value</th><th>job</th><th>state</th><th>median step ms</th><th>vs best</th>{gpu_head}
<th>top finding</th><th>report</th></tr>{"".join(rows)}</table>
</body></html>
"""
