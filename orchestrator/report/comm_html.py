"""The HTML communication section: bus bandwidth per collective kind and message size (a bar
against the nominal link rate where known), per group/pair, and intra- vs inter-node shares."""

from __future__ import annotations

from html import escape

from orchestrator.analyze.model_report import Report


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def comm_section(report: Report) -> str:
    c = report.comm
    if c is None:
        return ""
    if c.size_source == "none":
        return (f"<h2>Communication</h2><p>No message sizes in this capture ({c.comm_kernels} NCCL kernels): "
                f"{_e(c.hint or '')}</p>")
    top = c.nominal.gbps_per_direction if c.nominal else max((k.median_busbw_gbps or 0) for k in c.by_kind) or 1.0
    nom = (f"Bars: median bus bandwidth against {_e(c.nominal.gbps_per_direction)} GB/s per direction, "
           f"{_e(c.nominal.link)} of {_e(c.nominal.gpu)} ({_e(c.nominal.why)})." if c.nominal else
           "No nominal link rate for this GPU model: bars are relative to the fastest row.")
    rows = "".join(
        f"<tr><td>{_e(k.kind)}</td><td>{_e(k.size_bucket)}</td><td>{_e(k.scope)}</td><td>{k.instances}</td>"
        f"<td>{k.transfer_ms:.1f}</td><td>{_f(k.median_algbw_gbps)}</td><td>{_f(k.median_busbw_gbps)}</td>"
        f"<td>{_f(k.p10_busbw_gbps)}</td><td>{_f(k.pct_of_nominal)}</td><td><svg width='160' height='10'>"
        f"<rect width='{160 * min(1.0, (k.median_busbw_gbps or 0) / top):.1f}' height='10' fill='#6a51a3'/>"
        f"</svg></td></tr>" for k in c.by_kind)
    units = "".join(
        f"<tr><td>{_e(u.unit)}</td><td>{_e(u.scope)}</td><td>{_e(u.kind)}</td><td>{_e(u.size_bucket)}</td>"
        f"<td>{u.instances}</td><td>{_f(u.median_busbw_gbps)}</td></tr>" for u in c.by_unit)
    scopes = "".join(
        f"<li>{_e(s.scope)}-node: {s.gbytes} GB, transfer {s.transfer_ms_per_rank} ms per rank "
        f"({s.share_of_window_pct}% of the window), waiting {s.wait_ms_per_rank} ms, median busbw "
        f"{_f(s.median_busbw_gbps)} GB/s</li>" for s in c.by_scope)
    return (f"<h2>Communication</h2><p>Bytes from NCCL's NVTX payload ({c.sized_kernels} of {c.comm_kernels} "
            f"NCCL kernels); transfer = kernel minus waiting for the last rank. {nom}</p><ul>{scopes}</ul>"
            "<table><tr><th>kind</th><th>size</th><th>scope</th><th>n</th><th>transfer ms</th><th>algbw GB/s</th>"
            f"<th>busbw GB/s</th><th>p10</th><th>% link</th><th></th></tr>{rows}</table>"
            "<h3>Per communicator group / p2p pair</h3><table><tr><th>unit</th><th>scope</th><th>kind</th>"
            f"<th>size</th><th>n</th><th>busbw GB/s</th></tr>{units}</table>")
