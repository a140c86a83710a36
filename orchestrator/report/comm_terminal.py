"""The terminal's communication table: bus bandwidth per collective kind and message size, with
the source of the byte counts and the nominal link it is compared with (or how to get sizes)."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from orchestrator.analyze.model_report import Report
from orchestrator.report.prose import say
from orchestrator.report.safe import cell

MAX_ROWS = 24


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def print_comm(report: Report, console: Console) -> None:
    c = report.comm
    if c is None:
        return
    if c.size_source == "none":
        say(console, f"communication: no message sizes in this capture ({c.comm_kernels} NCCL kernels): "
                      f"{cell(c.hint or '')}")
        return
    nom = f"; % link of {c.nominal.gbps_per_direction:g} GB/s/direction" if c.nominal else ""
    t = Table(title=f"communication (bytes: NCCL NVTX payload{nom})", box=box.SIMPLE_HEAD,
              padding=(0, 1), title_justify="left", expand=False, show_edge=False)
    for col in ("kind", "size", "scope", "n", "transfer ms", "algbw GB/s", "busbw GB/s", "p10", "% link"):
        t.add_column(col, justify="left" if col in ("kind", "size", "scope") else "right")
    rows = sorted(c.by_kind, key=lambda k: -k.transfer_ms)[:MAX_ROWS]
    for k in sorted(rows, key=lambda k: (k.kind, k.bucket_bytes, k.scope)):
        t.add_row(k.kind, k.size_bucket, k.scope, str(k.instances), f"{k.transfer_ms:.1f}", _f(k.median_algbw_gbps),
                  _f(k.median_busbw_gbps), _f(k.p10_busbw_gbps), _f(k.pct_of_nominal))
    console.print(t)
    for s in c.by_scope:
        say(console, f"  {s.scope}-node: {s.gbytes} GB, transfer {s.transfer_ms_per_rank} ms per rank "
                      f"({s.share_of_window_pct}% of the window), median busbw {_f(s.median_busbw_gbps)} GB/s")
