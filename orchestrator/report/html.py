"""One self-contained HTML file (inline SVG, CSS and the tables' sort script, no network).

Order: what was captured, findings (the top one first, fixes worded for the capture), the
stats tables (`_stats_tables`), then the pictures: per-rank GPU time bars (GPU) or
CPU phase bars (CPU-only), the aligned cross-rank timeline of a representative and of the
slowest step, rank x step heatmaps of step time and of waiting, stage bars, and the tables.
A CPU-only capture gets no GPU bars, columns or heatmaps: they would only show 100 % idle.
Every user- or trace-derived string goes through html.escape.
"""

from __future__ import annotations

from html import escape

from orchestrator.analyze.model_columns import html_columns
from orchestrator.analyze.model_report import RankMetrics, Report
from orchestrator.analyze.model_timeline import Extras
from orchestrator.analyze.rank_pick import by_findings, pick_ranks
from orchestrator.analyze.timeline import step_times
from orchestrator.ranklist import ranges
from orchestrator.report import comm_html, cpu_html, memory_html, timeline_svg
from orchestrator.report.heatmap import PURPLES, heatmap
from orchestrator.report.tables_html import stats_html
from orchestrator.report.wording import cost, no_gpu_banner, oneoff_steps_line, split_problems

COLORS = {"compute": "#2e7d32", "comm transfer": "#c62828", "comm waiting": "#8e24aa", "other GPU": "#f9a825",
          "idle": "#cfd8dc"}
MAX_BARS = 48  # rank bars drawn; more ranks: the ones findings name, the extremes and a sample
# Evidence lines a finding shows; the rest fold under "N more" (a rule that names every rank of a
# large job writes a line or two per rank: a wall of text above everything else otherwise).
EVIDENCE = 8
CSS = """body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1180px}h2{margin-top:28px}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;vertical-align:top}
.sev-high{color:#b71c1c;font-weight:bold}.sev-medium{color:#e65100}.sev-low{color:#01579b}
.sev-info{color:#1b5e20}.legend span{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}
svg text{font-size:11px}.top{border-left:6px solid #b71c1c;background:#fff8f6;padding:8px 14px;margin:12px 0}
.top-medium{border-left-color:#e65100;background:#fff8f0}.top-low{border-left-color:#01579b;background:#f3f9fd}
.top-info{border-left-color:#1b5e20;background:#f4f9f1}
.cpu{background:#e3f2fd;padding:8px 14px;border-left:6px solid #1565c0}.note{color:#555}"""


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def bar_ranks(report: Report) -> list[int]:
    """At most MAX_BARS ranks: those findings name (and their first 8 victims), the most and least
    idle, then an even sample."""
    by_idle = sorted(report.ranks, key=lambda r: r.gpu_idle_pct)
    extremes = [(r.rank, "extreme") for r in by_idle[:3] + by_idle[-3:]]
    return list(pick_ranks([r.rank for r in report.ranks], [*by_findings(report, 8), *extremes], MAX_BARS))


def rank_bars(report: Report) -> str:
    shown = set(bar_ranks(report))
    ranks = [r for r in report.ranks if r.rank in shown]
    width, bar_h, left = 640, 18, 70
    top = max((r.window_ms for r in ranks), default=0) or 1
    rows = []
    for i, r in enumerate(ranks):
        # The analysis's own split of the window (rank_metrics): nothing is computed here.
        parts = [("compute", r.compute_ms), ("comm transfer", r.exposed_transfer_ms),
                 ("comm waiting", r.exposed_wait_ms), ("other GPU", r.other_gpu_ms), ("idle", r.idle_ms)]
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
    more = (f'<p class="note">{len(ranks)} of {len(report.ranks)} ranks drawn: the ranks findings name, the most '
            "and least idle, and an even sample; every rank is in the Metrics table.</p>"
            if len(ranks) < len(report.ranks) else "")
    return (f'<div class="legend">{legend}</div><svg id="rank-bars" width="{left + width + 10}" '
            f'height="{h}" role="img">{"".join(rows)}</svg>{more}')


def step_heatmap(report: Report, extras: Extras | None = None) -> str:
    """Step time per rank and step: the iteration (step start to next step start), or the NVTX step
    ranges of a CPU-only capture."""
    times = step_times(report, extras or Extras())
    if report.gpu_activity:
        warm = {(int(rk), s.step) for s in report.steps if s.warmup for rk in s.ms_by_rank}
        what = "Iteration time"
    else:
        first = (extras or Extras()).first_step
        warm = {(rk, first[rk]) for rk in times if rk in first}
        what = "CPU time (NVTX step range)"
    once = oneoff_steps_line(report)
    return heatmap("step-heatmap", times, warm, what=what) + (f'<p class="note">{_e(once)}</p>' if once else "")


def wait_heatmap(report: Report, extras: Extras | None) -> str:
    if not report.gpu_activity:
        return ""
    if extras is None:
        return "<p>Waiting per step needs the store (run `orch report` on the run, not on a JSON).</p>"
    if not extras.wait_ms:
        return "<p>No rank waited for another in NCCL: no waiting heatmap.</p>"
    values = {r.rank: {s.step: extras.wait_ms.get(r.rank, {}).get(s.step, 0.0) for s in r.step_ms if not s.warmup}
              for r in report.ranks}
    return heatmap("wait-heatmap", values, set(), what="NCCL waiting for other ranks", palette=PURPLES,
                   least=True)


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


def timeline(report: Report, extras: Extras | None) -> str:
    if extras is None:
        return "<p>The timeline needs the store (run `orch report` on the run, not on a JSON).</p>"
    if not extras.views:
        return f"<p>{_e(extras.note or 'no steps: no timeline')}</p>"
    out = [timeline_svg.legend(report.gpu_activity)]
    for i, v in enumerate(extras.views):
        out.append(f"<h3>{_e(v.label)}</h3>{timeline_svg.render_view(v, i, report.gpu_activity)}")
        if v.hidden:
            h = v.hidden
            bits = [f"{h.n} other rank(s) not drawn"]
            if h.busy_ms_median is not None:
                bits.append(f"median compute {h.busy_ms_median:.1f} ms")
            if h.waiting_ms_max is not None:
                bits.append(f"waiting median {h.waiting_ms_median:.1f} ms, most {h.waiting_ms_max:.1f} ms "
                            f"(rank {h.waiting_max_rank})")
            out.append(f'<p class="note hidden-ranks">{_e("; ".join(bits))}.</p>')
    return "".join(out)


def _findings(report: Report) -> str:
    rows = "".join(
        f'<tr><td class="sev-{_e(f.severity)}">{_e(f.severity)}</td><td>{_e(f.title)}</td>'
        f'<td>{_ranks(f.ranks)}'
        + (f"<br>victims: {_e(ranges(f.victims))}" if f.victims else "") + "</td><td>"
        + _evidence(f.evidence) + f"</td><td>{_e(f.fix)}</td><td class=\"cost\">{_e(cost(f))}</td></tr>"
        for f in report.findings)
    top = ""
    if report.findings and report.findings[0].kind != "healthy":
        f = report.findings[0]
        top = (f'<div class="top top-{_e(f.severity)}" id="top-finding"><b class="sev-{_e(f.severity)}">'
               f"{_e(f.severity)}</b> "
               f"{_e(f.title)}<br><b>fix:</b> {_e(f.fix)}" + (f"<br>{_e(saves)}" if (saves := cost(f)) else "")
               + "</div>")
    return (f'{top}<h2>Findings</h2><table id="findings"><tr><th>severity</th><th>finding</th><th>ranks</th>'
            f"<th>evidence</th><th>fix</th><th>cost</th></tr>{rows}</table>")


def _ranks(ranks: list[int]) -> str:
    """The ranks as ranges; past a dozen runs the first ones, and every rank folded below."""
    short, full = ranges(ranks), ranges(ranks, None)
    if short == full:
        return _e(full)
    return f'{_e(short)}<details class="all-ranks"><summary>all</summary>{_e(full)}</details>'


def _evidence(lines: list[str]) -> str:
    """The first EVIDENCE lines, then the others folded (a click opens them; the JSON has all)."""
    items = [f"<li>{_e(e)}</li>" for e in lines]
    out = f"<ul>{''.join(items[:EVIDENCE])}</ul>"
    if len(items) > EVIDENCE:
        out += (f'<details class="more-evidence"><summary>{len(items) - EVIDENCE} more</summary>'
                f"<ul>{''.join(items[EVIDENCE:])}</ul></details>")
    return out


def _stats_tables(report: Report) -> str:
    """The nsys stats tables across ranks (Report.tables), right after the findings."""
    return stats_html(report)


def _gpu_tables(report: Report) -> str:
    g_rows = "".join(
        f"<tr><td>{_e(r.rank)}</td><td>{_e(name)}</td><td>{ms:.3f}</td></tr>"
        for r in report.ranks for name, ms in r.gaps_by_range_ms.items()
    ) or '<tr><td colspan="3">no GPU gaps above the threshold</td></tr>'
    cols = html_columns(RankMetrics)
    m_rows = "".join(
        "<tr>" + "".join(f"<td>{_e('' if getattr(r, k) is None else getattr(r, k))}</td>" for k, _ in cols) + "</tr>"
        for r in report.ranks
    )
    head = "".join(f"<th>{_e(c.header)}</th>" for _, c in cols)
    return (f'<h2>GPU gaps by CPU range (ms)</h2><table id="gaps"><tr><th>rank</th><th>range</th><th>ms</th></tr>'
            f'{g_rows}</table><h2>Metrics</h2><table id="metrics"><tr>{head}</tr>{m_rows}</table>')


def _problems(report: Report, notes: bool) -> str:
    """Failed or missing ranks at the top; notes on partial ranks at the bottom."""
    problems, notes_ = split_problems(report)
    problems, notes_ = ([], notes_) if notes else (problems, [])
    out = ""
    if problems:
        out += '<h2>Problems</h2><ul id="problems">' + "".join(
            f"<li>rank {_e(p.rank)}: {_e(p.status)} {_e(reason)}</li>" for p, reason in problems) + "</ul>"
    if notes_:
        out += '<h2>Notes</h2><ul id="notes" class="note">' + "".join(
            f"<li>rank {_e(p.rank)}: {_e(reason)}</li>" for p, reason in notes_) + "</ul>"
    return out


def _outcome(report: Report) -> str:
    """How the job ended, first: the timings of a job that did not complete read otherwise."""
    o = report.outcome
    if o is None:
        return ""
    cls = "sev-info" if o.state == "completed" else "sev-high"
    rows = "".join(f"<li>rank {r.rank}: last finished step {_e(r.last_done_step)}"
                   + (f", in {_e(' > '.join(r.open_ranges))} when its capture ended" if r.open_ranges else "")
                   + (f", then went on {r.ran_on_s:.1f} s outside its ranges" if r.ran_on_s is not None else "")
                   + (f", {_e(r.exit)}" if r.exit else "")
                   + (f"<br><small>stack: {_e(' ← '.join(r.stack))}</small>" if r.stack else "") + "</li>"
                   for r in o.ranks if o.state != "completed")
    rows += "".join(f"<li>{_e(line)}</li>" for line in o.flight_recorder)
    return (f'<p id="outcome" class="{cls}"><b>Job outcome:</b> {_e(o.line)}</p>' + (f"<ul>{rows}</ul>" if rows else "")
            + _stack_classes(report))


def _stack_classes(report: Report) -> str:
    """The ranks grouped by their main thread's stack when orch stopped them: how many, which,
    the program's own frame and what they waited in; the root's class marked."""
    o = report.outcome
    if o is None or o.state == "completed" or len(o.stack_classes) < 2:
        return ""
    root = ' class="sev-high"'
    rows = "".join(
        f"<tr{root if c.root else ''}><td>{c.count}</td><td>{_e(ranges(c.ranks))}</td>"
        f"<td>{_e(c.frame)}</td><td>{_e(c.waits or c.innermost)}</td><td>{'root' if c.root else ''}</td></tr>"
        for c in o.stack_classes[:32])
    more = f"<p>{len(o.stack_classes) - 32} more class(es) in the JSON</p>" if len(o.stack_classes) > 32 else ""
    return ('<h3 id="stack-classes">Main-thread stacks when the job was stopped</h3><table class="stack-classes">'
            "<tr><th>count</th><th>ranks</th><th>frame (the program's own)</th><th>waiting in / at</th><th></th></tr>"
            f"{rows}</table>{more}")


def _overhead(report: Report) -> str:
    o = report.capture_overhead
    return f'<p class="cpu" id="capture-overhead">{_e(o.line)}</p>' if o is not None and o.line else ""


def _replay(report: Report) -> str:
    """The replay's error, in every report, and its what-ifs, the most saving first."""
    rp = report.replay
    if rp is None:
        return ""
    whatifs = "".join(f"<li>{_e(w.label)}: saves {w.saving_ms:.1f} ms "
                      f"({w.saving_pct:.1f} %)</li>" for w in rp.shown())
    return f'<p id="replay">{_e(rp.line)}</p>' + (f'<ul class="whatifs">{whatifs}</ul>' if whatifs else "")


def render_html(report: Report, extras: Extras | None = None) -> str:
    """The page; `extras` (from the store) adds the timeline, CPU step heatmap and waiting heatmap."""
    w, gpu = report.window, report.gpu_activity
    sections = [_findings(report), _stats_tables(report)]  # stats tables right after the findings
    if gpu:
        sections += [f"<h2>Per-rank GPU time</h2>{rank_bars(report)}",
                     f"<h2>Aligned timeline across ranks</h2>{timeline(report, extras)}",
                     f"<h2>Step time per rank</h2>{step_heatmap(report, extras)}",
                     f"<h2>Waiting for other ranks per step</h2>{wait_heatmap(report, extras)}",
                     f"<h2>Stages</h2>{stage_bars(report)}", comm_html.comm_section(report),
                     memory_html.memory_section(report), _gpu_tables(report)]
    else:
        sections += [f"<h2>CPU phases per rank</h2>{cpu_html.phase_bars(report)}",
                     f"<h2>Aligned timeline across ranks (CPU)</h2>{timeline(report, extras)}",
                     f"<h2>Step time per rank</h2>{step_heatmap(report, extras)}",
                     cpu_html.cpu_table(report, extras)]
    banner = "" if gpu else (
        f'<p class="cpu" id="cpu-only">{_e(no_gpu_banner(report))}, so this report compares the ranks\' '
        "CPU phases and step times; GPU metrics do not apply.</p>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>orch report</title><style>{CSS}</style></head>
<body><h1>orch cross-rank report</h1>{_outcome(report)}
<p>Window: {_e(w.note)}; steps from {_e(w.step_source)}; gaps &ge; {_e(w.gap_ms)} ms. Store: {_e(report.store)}</p>
{_overhead(report)}{_replay(report)}{banner}{_problems(report, notes=False)}
{"".join(sections)}{_problems(report, notes=True)}
</body></html>
"""
