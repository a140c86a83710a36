"""The report as rich tables on the terminal. Every trace-derived string goes through
`safe.cell` (tables, markup prints) or is printed with markup off after `safe.plain`."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from orchestrator.analyze.model import Report
from orchestrator.report.safe import cell, plain
from orchestrator.report.tables_terminal import print_tables

_SEV = {"high": "bold red", "medium": "yellow", "low": "cyan", "info": "green"}


def _cpu_table(report: Report) -> Table:
    ranges = sorted({c.range for c in report.cpu_phases})
    ranks = sorted({c.rank for c in report.cpu_phases})
    val = {(c.rank, c.range): c.ms_per_step for c in report.cpu_phases}
    t = Table(title="CPU time per step by NVTX range (ms, self time)")
    t.add_column("rank", justify="right")
    for r in ranges:
        t.add_column(cell(r), justify="right")
    for rk in ranks:
        t.add_row(str(rk), *(f"{val[(rk, r)]:.2f}" if (rk, r) in val else "" for r in ranges))
    return t


def _rank_table(report: Report) -> Table:
    t = Table(title="per rank (ms unless %)", show_lines=False)
    for col in ("rank", "host", "stage", "window", "step", "compute", "comm", "overlap %", "exposed comm",
                "GPU idle %", "waiting", "late", "top gap range"):
        t.add_column(col, justify="right" if col not in ("host", "top gap range") else "left")
    for r in report.ranks:
        gaps = r.gaps_by_range_ms
        top = max(gaps.items(), key=lambda kv: kv[1]) if gaps else None
        t.add_row(
            str(r.rank), cell(r.host or ""), "" if r.stage is None else str(r.stage),
            f"{r.window_ms:.1f}", "" if r.mean_step_ms is None else f"{r.mean_step_ms:.1f}",
            f"{r.compute_ms:.1f}", f"{r.comm_ms:.1f}",
            f"{r.comm_overlap_pct:.1f}", f"{r.exposed_comm_ms:.1f}", f"{r.gpu_idle_pct:.1f}",
            f"{r.nccl_wait_ms + r.p2p_wait_ms:.1f}", f"{r.late_count}/{r.collectives}",
            cell(f"{top[0]} {top[1]:.1f}") if top else "",
        )
    return t


def print_report(report: Report, console: Console) -> None:
    w = report.window
    console.print(f"window: {plain(w.note)}; steps from {plain(w.step_source)}; gaps >= {w.gap_ms} ms",
                  markup=False)
    if not report.gpu_activity:
        console.print("no GPU activity was captured (CPU-only run or CUDA tracing off): comparing CPU phases")
        if report.cpu_phases:
            console.print(_cpu_table(report))
        _print_tail(report, console)
        return
    console.print(_rank_table(report))
    if report.stages:
        st = Table(title="stages")
        for col in ("stage", "ranks", "compute ms", "bubble %"):
            st.add_column(col)
        for s in report.stages:
            st.add_row(str(s.stage), ",".join(map(str, s.ranks)), f"{s.compute_ms:.1f}", f"{s.bubble_pct:.1f}")
        console.print(st)
        if report.imbalance:
            i = report.imbalance
            console.print(f"imbalance: ratio {i.ratio} (slowest stage {i.slowest_stage})")
    steady = [s for s in report.steps if not s.warmup]
    if steady:
        worst = max(steady, key=lambda s: s.spread_ms)
        console.print(f"steps: {len(report.steps)}, largest cross-rank spread {worst.spread_ms} ms "
                      f"at step {worst.step}")
    _print_tail(report, console)


def _print_tail(report: Report, console: Console) -> None:
    for n in report.notes:
        console.print(f"note: {plain(n)}", markup=False)
    for p in report.problems:
        style = "dim" if p.status == "partial" else "red"
        reason = plain(p.reason or "")
        reason = reason if len(reason) < 240 else reason[:237] + "..."
        console.print(f"[{style}]rank {p.rank}: {cell(p.status)}[/] {cell(reason)}", highlight=False)
    console.print("[bold]findings[/bold]")
    for i, f in enumerate(report.findings, 1):
        console.print(f"{i}. [{_SEV[f.severity]}]{f.severity}[/] {cell(f.title)} (ranks "
                      f"{', '.join(map(str, f.ranks))}"
                      + (f"; victims {', '.join(map(str, f.victims))}" if f.victims else "") + ")")
        for e in f.evidence:
            console.print(f"   - {plain(e)}", markup=False)
        console.print(f"   fix: {plain(f.fix)}", markup=False)
    print_tables(report, console)
