"""The nsys-stats tables in the HTML report: every row of Report.tables, one row per rank and
item, outlier cells highlighted, sortable by clicking a header (a few lines of inline JS, no
network). Every trace-derived string goes through html.escape."""

from __future__ import annotations

from html import escape
from typing import Any

from pydantic import BaseModel

from orchestrator.analyze.model_report import Report

CSS = ("table.stats td.out{background:#ffcdd2;font-weight:bold}table.stats td.wait{background:#ffe0b2}"
       "table.stats th{cursor:pointer;background:#eee}"
       "table.stats td.num{text-align:right}details{margin:8px 0}div.scroll{overflow-x:auto;max-width:100%}")
SORT_JS = """<script>
document.querySelectorAll('table.stats th').forEach(function(th){th.onclick=function(){
var t=th.closest('table'),b=t.tBodies[0],i=th.cellIndex,d=th.dataset.d=th.dataset.d==='a'?'d':'a';
Array.from(b.rows).sort(function(x,y){var p=x.cells[i].textContent,q=y.cells[i].textContent,
m=parseFloat(p),n=parseFloat(q),c=(isNaN(m)||isNaN(n))?p.localeCompare(q):m-n;return d==='a'?c:-c;})
.forEach(function(r){b.appendChild(r);});};});
</script>"""


def _e(x: object) -> str:
    return escape("" if x is None else str(x), quote=True)


def _cell(v: Any, mark: str = "", title: str = "") -> str:
    """`mark`: '' / 'out' (an outlier) / 'wait' (an outlier on a rank that waits for another)."""
    attr = f' title="{_e(title)}"' if title else ""
    if isinstance(v, float):
        return f'<td class="num{" " + mark if mark else ""}"{attr}>{v:.6g}</td>'
    if isinstance(v, int) and not isinstance(v, bool):
        return f'<td class="num">{v}</td>'
    return f'<td{" class=" + mark if mark else ""}{attr}>{_e(v)}</td>'


def _table(tid: str, rows: list[BaseModel], cols: list[str], flags: dict[str, str] | None = None,
           waits: dict[int, list[int]] | None = None) -> str:
    """A sortable table of model rows; `flags` maps a column to the bool field marking it an outlier;
    outliers of ranks in `waits` (rank -> the ranks it waits for) are marked as waiting."""
    if not rows:
        return f'<p id="{tid}">none in the window</p>'
    flags, waits = flags or {}, waits or {}

    def cell(r: BaseModel, c: str) -> str:
        if not (flags.get(c) and getattr(r, flags[c])):
            return _cell(getattr(r, c))
        rank = getattr(r, "rank", None)
        roots = waits.get(rank) if rank is not None else None
        if roots:
            return _cell(getattr(r, c), "wait", f"rank {rank} waits for rank(s) "
                                               f"{', '.join(map(str, roots))}: this is likely that wait")
        return _cell(getattr(r, c), "out")

    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    body = "".join("<tr>" + "".join(cell(r, c) for c in cols) + "</tr>" for r in rows)
    # Wider than the page with the GPU columns: the table scrolls, the page does not.
    return (f'<div class="scroll"><table class="stats" id="{tid}"><thead><tr>{head}</tr></thead>'
            f'<tbody>{body}</tbody></table></div>')


_DUR = ["count", "total_ms", "mean_ms", "median_ms", "min_ms", "max_ms", "per_step_ms"]


def stats_html(report: Report) -> str:
    """The phase table first (open), the others folded; all sortable. A CPU-only capture gets the
    CPU columns and tables only (GPU ones would be all zero)."""
    t = report.tables
    gpu = report.gpu_activity
    gpu_cols = ["gpu_ms", "gpu_per_step_ms", "gpu_median_ms", "gpu_ops"] if gpu else []
    waits = report.waits_for()
    phases = _table("phases", t.phases, ["rank", "range", "source", *_DUR, "cpu_median_ms", *gpu_cols],
                    {"per_step_ms": "cpu_outlier", "total_ms": "cpu_outlier", "gpu_ms": "gpu_outlier",
                     "gpu_per_step_ms": "gpu_outlier"}, waits)
    parts = [
        ("kernels", "Kernels across ranks (cuda_gpu_kern_sum)",
         _table("kernels", t.kernels, ["rank", "short_name", "cls", "origin", *_DUR, "pct", "median_total_ms",
                                       "min_total_ms", "max_total_ms"],
                {"total_ms": "outlier", "per_step_ms": "outlier"}, waits)),
        ("memory", "Memory operations across ranks (cuda_gpu_mem_time_sum / cuda_gpu_mem_size_sum)",
         _table("memory", t.memory, ["rank", "op", "host_kind", *_DUR, "pct", "mb", "median_mb", "median_total_ms"],
                {"total_ms": "outlier", "per_step_ms": "outlier"}, waits)),
        ("api", "CUDA API and OS runtime calls (cuda_api_sum / osrt_sum; thread rows under the all-threads row)",
         _table("api", t.api, ["rank", "api", "name", "thread", "role", *_DUR, "pct"])),
        ("threads", "Threads: blocked vs launching",
         _table("threads", t.threads, ["rank", "thread", "role", "span_ms", "launch_ms", "sync_ms", "wait_ms",
                                       "blocked_ms", "blocked_per_step_ms", "blocked_pct", "launch_pct", "top_wait"])),
        ("sync", "Synchronous copies / memsets and sync APIs (nsys analyze)",
         _table("sync-copies", t.sync_copies, ["rank", "what", "count", "api_ms", "gpu_ms", "mb", "per_step",
                                               "top_api"])
         + _table("sync-apis", t.sync_apis, ["rank", "name", "count", "ms", "max_ms", "per_step"])),
        ("slices", "GPU time slices under 50 % busy (nsys analyze gpu-low-util)",
         _table("low-util", t.low_util_slices, ["rank", "slice", "start_ms", "ms", "util_pct"])),
    ]
    if not gpu:  # no kernels, copies or GPU slices in a CPU-only capture
        parts = [p for p in parts if p[0] not in ("kernels", "memory", "sync", "slices")]
    folded = "".join(f'<details id="sec-{k}"><summary><b>{_e(title)}</b></summary>{body}</details>'
                     for k, title, body in parts)
    what = "nvtx_sum + GPU projection" if gpu else "nvtx_sum"
    kept = t.kept_line(len(report.ranks))
    return (f"<style>{CSS}</style><h2>Phases across ranks ({what}; scope: {_e(t.scope)})</h2>"
            f"<p>Outliers (red): above the other ranks' median by more than 3 MAD, 10 % and 1 ms."
            + (" Orange: the same on a rank that waits for a late one (the findings name it): its extra time"
               " there is likely waiting; look at the late rank first." if waits else "") + "</p>"
            + (f'<p id="tables-ranks">{_e(kept)}.</p>' if kept else "") + f"{phases}{folded}{SORT_JS}")
