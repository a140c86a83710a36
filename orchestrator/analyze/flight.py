"""PyTorch's Flight Recorder, read for a job that hung: which ranks never entered the collective
the others were waiting in, and which ranks entered the same collective as different
operations (a mismatch that never completes).

Per process group every collective has a sequence number, the same on every member rank
(NCCL and gloo alike): the ranks whose last one is below the group's highest never entered it.
The input is each rank's last collective per group (collect/evidence.py reads the dumps).
"""

from __future__ import annotations

from typing import Any


def mismatch(last: list[dict[str, Any]]) -> tuple[list[int], str, list[str]]:
    """The ranks behind (never entered their group's last collective), the first such collective
    in words, and one line per finding."""
    behind: set[int] = set()
    where = ""
    lines = []
    for pg in sorted({r["pg"] for r in last}):
        rows = [r for r in last if r["pg"] == pg]
        if len(rows) < 2:
            continue
        top = max(r["seq"] for r in rows)
        at_top = [r for r in rows if r["seq"] == top]
        late = [r for r in rows if r["seq"] < top]
        first = at_top[0]
        if late:
            behind.update(r["rank"] for r in late)
            where = where or f"collective #{top} ({first['op']}) of {first['pg_desc']}"
            was = "; ".join(f"rank {r['rank']}'s last was #{r['seq']} ({r['op']}) {_where(r)}" for r in late[:4])
            lines.append(f"Flight Recorder, {first['pg_desc']}: rank(s) {_ranks(late)} never entered collective "
                         f"#{top} ({first['op']} {first['sizes']}), which rank(s) {_ranks(at_top)} entered "
                         f"{_where(first)}; {was}")
        kinds = {(r["op"], r["sizes"]) for r in at_top}
        if len(kinds) > 1:
            what = "; ".join(f"rank {r['rank']}: {r['op']} {r['sizes']}" for r in at_top[:4])
            lines.append(f"Flight Recorder, {first['pg_desc']}: collective #{top} differs across ranks "
                         f"(a mismatch that never completes): {what}")
    return sorted(behind), where, lines


def _where(r: dict[str, Any]) -> str:
    """Where a rank called a collective: its Python frame, else the thread that issued it (DDP's
    gradient all-reduce comes from the autograd thread's C++ hook, with no Python stack)."""
    if r.get("frame"):
        return f"at {r['frame']}"
    if str(r.get("thread", "")).startswith("pt_autograd"):
        return "in backward (the autograd thread: DDP's gradient all-reduce)"
    return "at ?"


def _ranks(rows: list[dict[str, Any]]) -> str:
    rs = sorted(r["rank"] for r in rows)
    return ", ".join(map(str, rs[:8])) + (f" and {len(rs) - 8} more" if len(rs) > 8 else "")
