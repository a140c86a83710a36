"""The report on the terminal: the top finding first, then the tables, in 100 columns.

By default every table fits 100 columns (the narrow column set, long names cut with an
ellipsis, at most `MAX_ROWS` ranks: the ones findings name, the extremes, a sample) and each
finding shows its first evidence lines; `--wide` prints every column, rank and line. A
CPU-only capture prints CPU phases instead of GPU columns, and fixes worded for it.
Every trace-derived string goes through `safe.cell` (tables, markup prints) or is printed
with markup off after `safe.plain`.
"""

from __future__ import annotations

import statistics

from rich import box
from rich.console import Console
from rich.table import Table

from orchestrator.analyze.model_columns import Terminal, terminal_columns
from orchestrator.analyze.model_report import RankMetrics, Report
from orchestrator.analyze.rank_pick import by_findings, pick_ranks
from orchestrator.analyze.stacks import line as stack_line
from orchestrator.ranklist import ranges
from orchestrator.report.comm_terminal import print_comm
from orchestrator.report.critical_terminal import critical_lines, replay_lines
from orchestrator.report.memory_terminal import print_memory
from orchestrator.report.prose import WIDTH, say
from orchestrator.report.safe import cell, plain
from orchestrator.report.tables_terminal import print_tables
from orchestrator.report.wording import cost, no_gpu_banner, oneoff_steps_line, split_problems

_SEV = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "green"}
MAX_ROWS = 16
EVIDENCE = 3  # evidence lines per finding unless --wide


def _table(title: str, wide: bool) -> Table:
    return Table(title=title, box=box.SIMPLE_HEAD if not wide else box.HEAVY_HEAD, padding=(0, 1),
                 title_justify="left", expand=False, show_edge=wide)


def shown_ranks(report: Report, ranks: list[int], limit: int = MAX_ROWS) -> list[int]:
    """The ranks worth a row when there are too many: named by findings (and their first two
    victims), then an even sample."""
    return list(pick_ranks(ranks, by_findings(report, 2, among=ranks), limit))


def _cpu_table(report: Report, wide: bool) -> tuple[Table, int]:
    val = {(c.rank, c.range): c.ms_per_step for c in report.cpu_phases}
    ranks = sorted({c.rank for c in report.cpu_phases})
    ranges = sorted({c.range for c in report.cpu_phases},
                    key=lambda g: -max(val.get((rk, g), 0.0) for rk in ranks))
    if not wide:
        ranges = ranges[:6]
    t = _table("CPU time per step by NVTX range (ms, self time)", wide)
    t.add_column("rank", justify="right")
    for r in ranges:
        t.add_column(cell(r), justify="right", max_width=None if wide else 12, overflow="ellipsis", no_wrap=True)
    t.add_column("all ranges", justify="right")
    shown = ranks if wide else shown_ranks(report, ranks)
    for rk in shown:
        total = sum(v for (k, _), v in val.items() if k == rk)
        t.add_row(str(rk), *(f"{val[(rk, r)]:.2f}" if (rk, r) in val else "" for r in ranges), f"{total:.2f}")
    return t, len(ranks) - len(shown)


def _rank_table(report: Report, wide: bool) -> tuple[Table, int]:
    """The columns the fields of RankMetrics declare (model_columns.Terminal), in their order."""
    t = _table("per rank (ms unless %)", wide)
    cols = terminal_columns(RankMetrics, wide)
    for _, col in cols:
        t.add_column(col.label, justify="left" if col.left else "right")
    ranks = report.ranks if wide else [report.rank(rk) for rk in shown_ranks(report, [r.rank for r in report.ranks])]
    for r in ranks:
        if r is None:
            continue
        t.add_row(*(_cell(r, name, col, wide) for name, col in cols))
    return t, len(report.ranks) - len(ranks)


def _cell(r: RankMetrics, name: str, col: Terminal, wide: bool) -> str:
    v = col.value(r, wide) if col.value else getattr(r, name)
    return "" if v is None else cell(format(v, col.fmt))


def _findings(report: Report, console: Console, wide: bool) -> None:
    if not report.findings:
        console.print("[bold]findings[/bold]: none")
        return
    console.print("[bold]findings[/bold] (most costly first)")
    for i, f in enumerate(report.findings, 1):
        most = None if wide else 8
        console.print(f"{i}. [{_SEV[f.severity]}]{f.severity}[/] {cell(f.title)} (ranks {ranges(f.ranks, most)}"
                      + (f"; victims {ranges(f.victims, most)}" if f.victims else "") + ")", highlight=False)
        if saves := cost(f):
            _line(console, f"   {saves}", wide)
        shown = f.evidence if wide else f.evidence[:EVIDENCE]
        for e in shown:
            _line(console, f"   - {plain(e)}", wide)
        if len(shown) < len(f.evidence):
            _line(console, f"   - ... {len(f.evidence) - len(shown)} more (--wide)", wide)
        _line(console, f"   fix: {plain(f.fix)}", wide)


def _line(console: Console, text: str, wide: bool, indent: str = "     ") -> None:
    say(console, text, indent, wide)


def _stats_tables(report: Report, console: Console, wide: bool) -> None:
    """The nsys stats tables across ranks (Report.tables), right after the findings."""
    print_tables(report, console)


def print_report(report: Report, console: Console, wide: bool = False) -> None:
    if not wide and console.width > WIDTH:
        console.width = WIDTH
    w = report.window
    if report.outcome is not None:  # how the job ended comes before anything measured in it
        style = "green" if report.outcome.state == "completed" else "bold red"
        console.print(f"[{style}]job outcome:[/] {cell(report.outcome.line)}", highlight=False)
        for line in report.outcome.flight_recorder:
            _line(console, plain(line), wide, "  ")
        if report.outcome.state != "completed" and (classes := stack_line(report.outcome.stack_classes)):
            _line(console, plain(classes), wide, "  ")
        for r in report.outcome.ranks:  # the ranks the outcome names: where each one stood
            if r.stack and (r.rank in report.outcome.behind or r.exit):
                _line(console, plain(f"  rank {r.rank} stack: {' <- '.join(r.stack)}"), wide, "    ")
    _line(console, f"window: {plain(w.note)}; steps from {plain(w.step_source)}; gaps >= {w.gap_ms} ms", wide, "  ")
    if report.capture_overhead is not None and report.capture_overhead.line:
        console.print(f"[yellow]{cell(report.capture_overhead.line)}[/]", highlight=False)
    if not report.gpu_activity:
        console.print(f"{no_gpu_banner(report)}: comparing the ranks' CPU phases", highlight=False)
    _findings(report, console, wide)
    _stats_tables(report, console, wide)
    if not report.gpu_activity:
        if report.cpu_phases:
            t, hidden = _cpu_table(report, wide)
            console.print(t)
            _more(console, hidden)
        _print_tail(report, console, wide)
        return
    t, hidden = _rank_table(report, wide)
    console.print(t)
    _more(console, hidden, report)
    print_comm(report, console)
    print_memory(report, console)
    for line in [*critical_lines(report), *replay_lines(report)]:
        _line(console, plain(line), wide, "    ")
    if report.stages:
        st = _table("stages", wide)
        for col in ("stage", "ranks", "compute ms", "bubble %"):
            st.add_column(col)
        for s in report.stages:
            rk = ",".join(map(str, s.ranks if wide or len(s.ranks) <= 6 else [*s.ranks[:3], "…", s.ranks[-1]]))
            st.add_row(str(s.stage), rk, f"{s.compute_ms:.1f}", f"{s.bubble_pct:.1f}")
        console.print(st)
        if report.imbalance:
            i = report.imbalance
            console.print(f"imbalance: ratio {i.ratio} (slowest stage {i.slowest_stage})")
    steady = [s for s in report.steps if not s.warmup]
    if steady:
        worst = max(steady, key=lambda s: s.spread_ms)
        once = oneoff_steps_line(report)
        console.print(f"steps: {len(report.steps)}, largest cross-rank spread {worst.spread_ms} ms "
                      f"at step {worst.step}" + (f"; {once}" if once else ""), markup=False)
    _print_tail(report, console, wide)


def _more(console: Console, hidden: int, report: Report | None = None) -> None:
    if hidden <= 0:
        return
    line = f"... {hidden} more rank(s) not shown (--wide shows every rank)"
    if report is not None:
        idle = [r.gpu_idle_pct for r in report.ranks]
        line += f"; GPU idle % over all {len(idle)}: min {min(idle):.1f}, median {statistics.median(idle):.1f}, " \
                f"max {max(idle):.1f}"
    _line(console, line, False, "    ")


def _print_tail(report: Report, console: Console, wide: bool = False) -> None:
    for n in report.notes:
        _line(console, f"note: {plain(n)}", wide, "  ")
    problems, notes = split_problems(report)
    for p, reason in problems + notes:
        style = "dim" if p.status == "partial" else "red"
        reason = plain(reason)
        reason = reason if len(reason) < 240 else reason[:237] + "..."
        console.print(f"[{style}]rank {p.rank}: {cell(p.status)}[/] {cell(reason)}", highlight=False)
