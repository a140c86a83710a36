"""PyTorch's Flight Recorder, read for a job that hung: which ranks never entered the collective
the others were waiting in, and which ranks entered the same collective as different
operations (a mismatch that never completes).

Per process group every collective has a sequence number, the same on every member rank
(NCCL and gloo alike): the ranks whose last one is below the group's highest never entered it.
The input is each rank's last collective per group (submit/evidence.py reads the dumps).
"""

from __future__ import annotations

from orchestrator.store.evidence import LastCollective


def mismatch(last: list[LastCollective]) -> tuple[list[int], str, list[str]]:
    """The ranks furthest behind (whose last collective is their group's lowest, below its
    highest), the collective the furthest rank entered in words, and one line per finding."""
    behind: set[int] = set()
    where = ""
    lines = []
    for rows, top in _groups(last):
        if len(rows) < 2:
            continue
        at_top = [r for r in rows if r.seq == top]
        late = [r for r in rows if r.seq < top]
        first = at_top[0]
        if late:
            # The furthest behind hold up the others; a rank between them waited for them too.
            low = min(r.seq for r in late)
            behind.update(r.rank for r in late if r.seq == low)
            where = where or f"collective #{top} ({first.op}) of {first.pg_desc}"
            was = "; ".join(f"rank {r.rank}'s last was #{r.seq} ({r.op}) {_where(r)}" for r in late[:4])
            lines.append(f"Flight Recorder, {first.pg_desc}: rank(s) {_ranks(late)} never entered collective "
                         f"#{top} ({first.op} {first.sizes}), which rank(s) {_ranks(at_top)} entered "
                         f"{_where(first)}; {was}")
        kinds = {(r.op, r.sizes) for r in at_top}
        if len(kinds) > 1:
            what = "; ".join(f"rank {r.rank}: {r.op} {r.sizes}" for r in at_top[:4])
            lines.append(f"Flight Recorder, {first.pg_desc}: collective #{top} differs across ranks "
                         f"(a mismatch that never completes): {what}")
    return sorted(behind), where, lines


def odd_ones(last: list[LastCollective]) -> list[int]:
    """The ranks whose collective differs from the others' at the same sequence number: the
    smallest group of one operation and size; between groups as small, the one the program called
    from its own code rather than a library's thread (a rank-0-only all-reduce for a log line
    against DDP's gradient all-reduce from the autograd thread). [] where that does not decide."""
    odd: set[int] = set()
    for rows, top in _groups(last):
        groups: dict[tuple[str, str], list[LastCollective]] = {}
        for r in rows:
            if r.seq == top:
                groups.setdefault((r.op, r.sizes), []).append(r)
        if len(groups) < 2:
            continue
        small = min(len(g) for g in groups.values())
        cand = [g for g in groups.values() if len(g) == small]
        own = [g for g in cand if all(r.frame and not r.thread.startswith("pt_autograd") for r in g)]
        if len(cand) > 1 and len(own) == 1:
            cand = own
        if len(cand) == 1:
            odd.update(r.rank for r in cand[0])
    return sorted(odd)


def diverged(rows: list[LastCollective]) -> tuple[list[int], list[str]]:
    """The ranks that called a different collective where the ranks' collectives first differ
    (submit/evidence.py: diverged_collectives) and that line in words; ([], []) without one."""
    if not rows:
        return [], []
    odd = odd_ones(rows)
    first = rows[0]
    called = [r for r in rows if r.rank in odd]
    others = [r for r in rows if r.rank not in odd]
    if not called or not others:
        what = "; ".join(f"rank {r.rank}: {r.op} {r.sizes} {_where(r)}" for r in rows[:4])
        return odd, [f"Flight Recorder, {first.pg_desc}: collective #{first.seq} differs across ranks "
                     f"(a mismatch): {what}"]
    c, o = called[0], others[0]
    return odd, [f"Flight Recorder, {first.pg_desc}: collective #{first.seq} differs across ranks: rank(s) "
                 f"{_ranks(called)} called {c.op} {c.sizes} {_where(c)}, where rank(s) {_ranks(others)} called "
                 f"{o.op} {o.sizes} {_where(o)}; every later collective of rank(s) {_ranks(called)} is paired "
                 "with a different one on the others"]


def _groups(last: list[LastCollective]) -> list[tuple[list[LastCollective], int]]:
    """Per process group, its ranks' last collectives and the highest sequence number among them."""
    out = []
    for pg in sorted({r.pg for r in last}):
        rows = [r for r in last if r.pg == pg]
        out.append((rows, max(r.seq for r in rows)))
    return out


def _where(r: LastCollective) -> str:
    """Where a rank called a collective: its Python frame, else the thread that issued it (DDP's
    gradient all-reduce comes from the autograd thread's C++ hook, with no Python stack)."""
    if r.frame:
        return f"at {r.frame}"
    if r.thread.startswith("pt_autograd"):
        return "in backward (the autograd thread: DDP's gradient all-reduce)"
    return "at ?"


def _ranks(rows: list[LastCollective]) -> str:
    rs = sorted(r.rank for r in rows)
    return ", ".join(map(str, rs[:8])) + (f" and {len(rs) - 8} more" if len(rs) > 8 else "")
