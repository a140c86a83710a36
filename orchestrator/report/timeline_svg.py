"""The aligned cross-rank timeline of one step as inline SVG (no script: hover = SVG <title>).

One lane per shown rank on the store's aligned clock: NVTX ranges of the loop thread on top
(nested levels stacked), host syncs under them, then the GPU row, whose grey background is
idle, with compute, NCCL transfer, NCCL waiting for another rank and other GPU work on it.
The step's critical path (59_critical_path.sql) is a red bar under the GPU row of each rank
while it held the step (thicker where it put excess on the path), and each wait on the path is a
red arrow from the rank waited for to the waiter, with the wait outlined on the waited-for lane.
Intervals closer than half a pixel merge (thousands of kernels per step would otherwise be
thousands of invisible rects); the merged title counts them.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable
from html import escape

from orchestrator.analyze.model_timeline import Seg, StepView

COLORS = {"compute": "#2e7d32", "comm transfer": "#c62828", "comm waiting": "#8e24aa", "other GPU": "#f9a825",
          "sync": "#ff6f00", "idle": "#e3e7ea"}
WIDTH, LEFT = 980, 110
NVTX_H, SYNC_H, GPU_H, GAP = 11, 6, 16, 10
PASTELS = ["#90caf9", "#a5d6a7", "#ffe082", "#ce93d8", "#80cbc4", "#ffab91", "#b0bec5", "#f48fb1", "#c5e1a5"]


def _e(x: object) -> str:
    return escape(str(x), quote=True)


def nvtx_color(name: str) -> str:
    """A stable colour per range group, so `data_load` is the same colour on every lane."""
    return PASTELS[zlib.crc32(group(name).encode()) % len(PASTELS)]


def group(name: str) -> str:
    """The analysis' range_group in Python: `forward mb3` -> `forward`, `backward, seq = 5` -> `backward`."""
    return re.sub(r"\s*(mb|microbatch|#)?\s*\d+$", "", name.split(",", 1)[0]).strip()


def merge(segs: list[Seg], px_ms: float) -> list[tuple[float, float, str, int]]:
    """(s, e, title, count) per kind, neighbours closer than half a pixel merged."""
    out: list[tuple[float, float, str, int]] = []
    for sg in sorted(segs, key=lambda x: x.s):
        if out and sg.s - out[-1][1] < 0.5 * px_ms:
            s, e, title, n = out[-1]
            out[-1] = (s, max(e, sg.e), title, n + 1)
        else:
            out.append((sg.s, sg.e, sg.name, 1))
    return out


def _ticks(t1: float) -> list[float]:
    raw = max(t1, 1e-3) / 8
    step = next(m * 10 ** k for k in range(-3, 7) for m in (1, 2, 5) if m * 10 ** k >= raw)
    return [i * step for i in range(int(t1 / step) + 1)]


def render_view(view: StepView, idx: int, gpu: bool) -> str:
    """One step's lanes as an SVG with id `timeline-<idx>`."""
    t1 = view.t1 or 1.0
    px_ms = t1 / WIDTH

    def x(ms: float) -> float:
        return LEFT + WIDTH * ms / t1

    depth = max((s.depth for ln in view.lanes for s in ln.cpu), default=0) + 1
    nvtx_h = NVTX_H if gpu else NVTX_H + 5
    lane_h = depth * nvtx_h + (SYNC_H + GPU_H if gpu else 0) + GAP
    top = 20
    parts = [f'<text x="{x(t):.1f}" y="12" text-anchor="middle">{t:g}</text>'
             f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="15" y2="{top + lane_h * len(view.lanes)}" stroke="#eee"/>'
             for t in _ticks(t1)]
    gpu_y: dict[int, float] = {}
    for i, ln in enumerate(view.lanes):
        y0 = top + i * lane_h
        role = f" ({ln.role})" if ln.role and ln.role != "sample" else ""
        color = "#b71c1c" if ln.role == "root" else "#222"
        body = [f'<text x="0" y="{y0 + 11}" fill="{color}">rank {_e(ln.rank)}{_e(role)}</text>']
        for c in ln.cpu:  # NVTX ranges are few per step; each keeps its own name
            if (c.e - c.s) < 0.3 * px_ms:
                continue
            yy = y0 + c.depth * nvtx_h
            w = max(1.0, x(c.e) - x(c.s))
            label = (f'<text x="{x(c.s) + 2:.1f}" y="{yy + nvtx_h - 2}" font-size="9">'
                     f"{_e(c.name[: int(w / 6)])}</text>") if w > 30 else ""
            body.append(f'<rect class="tl-nvtx" data-depth="{c.depth}" x="{x(c.s):.1f}" y="{yy}" width="{w:.1f}" '
                        f'height="{nvtx_h - 1}" fill="{nvtx_color(c.name)}"><title>{_e(c.name)}: '
                        f"{c.e - c.s:.3f} ms</title></rect>{label}")
        if gpu:
            ys = y0 + depth * nvtx_h
            for s, e, title, n in merge(ln.syncs, px_ms):
                more = f" (+{n - 1} more)" if n > 1 else ""
                body.append(f'<rect class="tl-seg" data-kind="sync" x="{x(s):.1f}" y="{ys}" '
                            f'width="{max(1.0, x(e) - x(s)):.1f}" height="{SYNC_H - 1}" fill="{COLORS["sync"]}">'
                            f"<title>host sync {_e(title)}{more}: {e - s:.3f} ms</title></rect>")
            yg = ys + SYNC_H
            gpu_y[ln.rank] = yg
            body.append(f'<rect class="tl-idle" x="{LEFT}" y="{yg}" width="{WIDTH}" height="{GPU_H}" '
                        f'fill="{COLORS["idle"]}"><title>rank {_e(ln.rank)} GPU idle where nothing is drawn'
                        "</title></rect>")
            for kind in ("compute", "other GPU", "comm transfer", "comm waiting"):
                segs = [g for g in ln.gpu if g.kind == kind]
                # Waits are kept one per kernel: they are what the reader (and a test) checks.
                merged = ([(g.s, g.e, g.name, 1) for g in segs] if kind == "comm waiting"
                          else merge(segs, px_ms))
                for s, e, title, n in merged:
                    what = f"{n} kernels, e.g. {title}" if n > 1 else title
                    body.append(f'<rect class="tl-seg" data-kind="{kind}" data-s="{s:.4f}" data-e="{e:.4f}" '
                                f'x="{x(s):.1f}" y="{yg}" width="{max(0.5, x(e) - x(s)):.1f}" height="{GPU_H}" '
                                f'fill="{COLORS[kind]}"><title>rank {_e(ln.rank)} {kind}: {_e(what)}; '
                                f"{e - s:.3f} ms at +{s:.3f} ms</title></rect>")
        parts.append(f'<g class="lane" data-rank="{_e(ln.rank)}" data-role="{_e(ln.role)}">{"".join(body)}</g>')
    parts.extend(_critical(view, gpu_y, x))
    parts.extend(_path(view, gpu_y, x))
    h = top + lane_h * len(view.lanes) + 4
    return (f'<svg id="timeline-{idx}" class="timeline" data-step="{_e(view.step)}" data-t0-ns="{view.t0_ns}" '
            f'width="{LEFT + WIDTH + 20}" height="{h}" role="img">{"".join(parts)}</svg>')


def _critical(view: StepView, gpu_y: dict[int, float], x: Callable[[float], float]) -> list[str]:
    """The critical path: a bar under the GPU row of the rank that held the step at each moment."""
    out = []
    for g in view.path:
        if g.rank not in gpu_y:
            continue
        h = 4 if g.created > 0 else 2
        out.append(f'<rect class="cp" data-rank="{_e(g.rank)}" data-s="{g.s:.4f}" data-e="{g.e:.4f}" '
                   f'x="{x(g.s):.1f}" y="{gpu_y[g.rank] + GPU_H + 1}" width="{max(0.5, x(g.e) - x(g.s)):.1f}" '
                   f'height="{h}" fill="#d50000"><title>critical path: rank {_e(g.rank)} from +{g.s:.3f} to '
                   f"+{g.e:.3f} ms; {g.created:.3f} ms of others' excess waiting came from here</title></rect>")
    return out


def _path(view: StepView, gpu_y: dict[int, float], x: Callable[[float], float]) -> list[str]:
    """Red arrows waited-for -> waiter at the end of each wait on the path (when the waited-for
    rank arrived)."""
    out = []
    edges = sorted((e for e in view.edges if e.victim in gpu_y and e.root in gpu_y and e.e > e.s),
                   key=lambda e: e.s - e.e)[:20]
    for e in edges:
        yr, yv = gpu_y[e.root], gpu_y[e.victim]
        via = f" via rank {e.via}" if e.via != e.root else ""
        title = f"rank {e.victim} waited {e.e - e.s:.3f} ms for rank {e.root}{via}"
        out.append(f'<g class="path" data-root="{_e(e.root)}" data-victim="{_e(e.victim)}">'
                   f'<rect x="{x(e.s):.1f}" y="{yr - 1}" width="{max(1.0, x(e.e) - x(e.s)):.1f}" height="{GPU_H + 2}" '
                   f'fill="none" stroke="#d50000" stroke-dasharray="4,2"><title>rank {_e(e.root)} was late here: '
                   f'{_e(title)}</title></rect><line x1="{x(e.e):.1f}" y1="{yr + GPU_H / 2}" x2="{x(e.e):.1f}" '
                   f'y2="{yv + GPU_H / 2}" stroke="#d50000" stroke-width="2" marker-end="url(#arrow)">'
                   f"<title>{_e(title)}</title></line></g>")
    if out:
        out.insert(0, '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="6" '
                      'markerHeight="6" orient="auto-start-reverse"><path d="M 0 0 L 10 5 L 0 10 z" fill="#d50000"/>'
                      "</marker></defs>")
    return out


def legend(gpu: bool) -> str:
    keys = ["compute", "comm transfer", "comm waiting", "other GPU", "sync", "idle"] if gpu else []
    names = {"sync": "host sync (CPU blocked)", "idle": "GPU idle"}
    items = "".join(f'<span style="background:{COLORS[k]}"></span>{_e(names.get(k, k))}' for k in keys)
    path = ('<span style="background:#d50000"></span>critical path (bar: who held the step; arrow: waited-for '
            '&rarr; waiter)') if gpu else ""
    return f'<div class="legend">NVTX ranges of the loop thread on top of each lane. {items}{path}</div>'
