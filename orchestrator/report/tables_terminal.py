"""The nsys-stats tables on the terminal: a compact phase table by default (what users of
`nsys stats -r nvtx_sum` look at first), kernels / memory ops / calls / threads with
`--tables all`. Cross-rank by construction: one row per item with the median over ranks and
the ranks that stand out, plus per-rank columns when there are few ranks. Every trace-derived
string goes through `safe.cell`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from itertools import groupby, islice
from statistics import median
from typing import Any

from rich.console import Console
from rich.table import Table

from orchestrator.analyze.model_report import Report
from orchestrator.analyze.rank_pick import by_findings, pick_ranks
from orchestrator.report.safe import cell

MAX_RANK_COLUMNS = 8  # per-rank columns up to this many ranks; beyond, median / min / max only
TOP = 12  # rows per table


def _fmt(x: float | None) -> str:
    return "" if x is None else f"{x:.3f}" if abs(x) < 10 else f"{x:.1f}"


def _ranks(rows: Iterable[Any]) -> list[int]:
    return sorted({r.rank for r in rows})


def _cross(title: str, rows: list[Any], key: Callable[[Any], str], value: Callable[[Any], float | None],
           outlier: Callable[[Any], bool], extra: dict[str, Callable[[list[Any]], str]] | None = None,
           waits: dict[int, list[int]] | None = None, first: Callable[[Any], int] | None = None) -> Table:
    """One row per item: extra columns, median, min/max rank, outlier ranks, per-rank values.
    Outliers are red, those of ranks in `waits` (they wait for a late rank) yellow. Items by
    `first` (a row's group, lowest first), then by median."""
    waits = waits or {}

    def mark(rk: int, text: str) -> str:
        return f"[{'yellow' if rk in waits else 'red'}]{text}[/]"
    by: dict[str, list[Any]] = defaultdict(list)
    for r in rows:
        by[key(r)].append(r)
    ranks = _ranks(rows)
    per_rank = len(ranks) <= MAX_RANK_COLUMNS
    t = Table(title=title)
    cols = ["item", *(extra or {}), "median", "min (rank)", "max (rank)", "outliers"]
    cols += [f"r{rk}" for rk in ranks] if per_rank else []
    for c in cols:
        t.add_column(c, overflow="fold", max_width=48 if c == "item" else None)
    items = sorted(by.items(), key=lambda kv: (first(kv[1][0]) if first else 0,
                                               -median(value(r) or 0 for r in kv[1])))[:TOP]
    shown_waiting = False
    for name, rs in items:
        vals = {r.rank: value(r) for r in rs}
        lo = min(vals, key=lambda k: vals[k] or 0)
        hi = max(vals, key=lambda k: vals[k] or 0)
        out = sorted(r.rank for r in rs if outlier(r))
        row = [cell(name), *(cell(f(rs)) for f in (extra or {}).values()),
               _fmt(median(v or 0 for v in vals.values())), f"{_fmt(vals[lo])} ({lo})", f"{_fmt(vals[hi])} ({hi})",
               ", ".join(mark(rk, f"{rk} (wait)" if rk in waits else str(rk)) for rk in out)]
        if per_rank:
            row += [(mark(rk, _fmt(vals[rk])) if rk in out else _fmt(vals.get(rk))) for rk in ranks]
        t.add_row(*row)
        shown_waiting = shown_waiting or any(rk in waits for rk in out)
    if shown_waiting:
        t.caption = "(wait), yellow: waits for a late rank (see findings); its extra time is likely that wait"
    return t


def _kernel_label(r: Any, unique: set[str]) -> str:
    """The short name where it names one kernel, else the start of the demangled name."""
    return r.short_name if r.short_name in unique else r.name[:80]


_SOURCE = {"loop": 0, "library": 1, "once": 2}


def _phase_tables(report: Report) -> list[Table]:
    """The loop's own ranges first; a library's domain and one-off set-up after them, marked."""
    p = report.tables.phases
    waits = report.waits_for()
    unit = "ms/step" if any(r.per_step_ms is not None for r in p) else "ms"
    src = {"source": lambda rs: rs[0].source} if any(r.source != "loop" for r in p) else {}
    return [
        _cross(f"phases: CPU {unit} in NVTX ranges (nsys nvtx_sum across ranks)", p, lambda r: r.range,
               lambda r: r.per_step_ms if r.per_step_ms is not None else r.total_ms, lambda r: r.cpu_outlier,
               {"n": lambda rs: str(rs[0].count), **src}, waits, first=lambda r: _SOURCE[r.source]),
        _cross(f"phases: GPU {unit} launched from the ranges (projection, same thread)",
               [r for r in p if r.gpu_ops], lambda r: r.range,
               lambda r: r.gpu_per_step_ms if r.gpu_per_step_ms is not None else r.gpu_ms, lambda r: r.gpu_outlier,
               {"ops": lambda rs: str(rs[0].gpu_ops), **src}, waits, first=lambda r: _SOURCE[r.source]),
    ]


def _all_tables(report: Report) -> list[Table]:
    t = report.tables
    waits = report.waits_for()
    unit = "ms/step" if t.kernels and t.kernels[0].per_step_ms is not None else "ms"

    def per(r: Any) -> float:
        return r.per_step_ms if r.per_step_ms is not None else r.total_ms

    names: dict[str, set[str]] = defaultdict(set)
    for k in t.kernels:
        names[k.short_name].add(k.name)
    short = {s for s, n in names.items() if len(n) == 1}  # short names that identify one kernel
    out = [
        _cross(f"kernels ({unit}, cuda_gpu_kern_sum)", t.kernels, lambda r: _kernel_label(r, short), per,
               lambda r: r.outlier,
               {"class": lambda rs: rs[0].cls, "med us": lambda rs: f"{median(r.median_ms for r in rs) * 1e3:.1f}"},
               waits),
        _cross(f"memory ops ({unit}, cuda_gpu_mem_time/size_sum)", t.memory, lambda r: f"{r.op} {r.host_kind}",
               per, lambda r: r.outlier, {"MB": lambda rs: f"{median(r.mb for r in rs):.1f}"}, waits),
    ]
    for api in ("cuda", "osrt"):
        rows = [r for r in t.api if r.api == api and r.tid is None]
        if rows:
            out.append(_cross(f"{'CUDA API' if api == 'cuda' else 'OS runtime'} calls ({unit}, all threads)",
                              rows, lambda r: r.name, per, lambda r: False,
                              {"calls": lambda rs: str(int(median(r.count for r in rs)))}))
    if t.threads:
        th = Table(title="threads: blocked (sync + OS waits) vs launching, in the steps")
        for c in ("rank", "thread", "role", "blocked %", "blocked ms/step", "launch %", "top wait"):
            th.add_column(c)
        # The most blocked threads of each shown rank (at least four, 4 * TOP rows in all): the
        # ranks the findings name first, then an even sample (rank_pick.py).
        shown = pick_ranks(sorted({r.rank for r in t.threads}), by_findings(report), TOP)
        rows = sorted((r for r in t.threads if r.rank in shown), key=lambda r: (r.rank, -(r.blocked_pct or 0)))
        for _, of_rank in groupby(rows, key=lambda r: r.rank):
            for r in islice(of_rank, max(4, 4 * TOP // len(shown))):
                th.add_row(str(r.rank), cell(r.thread), r.role, _fmt(r.blocked_pct), _fmt(r.blocked_per_step_ms),
                           _fmt(r.launch_pct), cell(r.top_wait or ""))
        out.append(th)
    return out


def print_tables(report: Report, console: Console) -> None:
    """The phase table (always, when there are ranges), the rest with `--tables all`."""
    kept = report.tables.kept_line(len(report.ranks))
    if kept and (report.tables.phases or report.tables.shown == "all"):
        console.print(cell(kept), style="dim")
    if report.tables.phases:
        for t in _phase_tables(report):
            if t.row_count:
                console.print(t)
    if report.tables.shown == "all":
        for t in _all_tables(report):
            if t.row_count:
                console.print(t)
