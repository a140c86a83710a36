"""The ranks' main-thread stacks as evidence of where a stopped job was stuck.

A stop finds most ranks of a hung job at the same point, waiting for the few that never came:
in a collective (torch.distributed), in backward (DDP's gradient all-reduce waits there), or in
a CUDA synchronisation. Grouped by their whole stack (submit/evidence.py: `stack_classes`, the
equivalence classes of LLNL's Stack Trace Analysis Tool), the waiting ranks are one large class
and the few elsewhere are the root, wherever the NVTX ranges cannot tell them apart (every rank
"in train_step") and wherever the Flight Recorder is empty (an older torch, a buffer left at 0).
Each class is named by the innermost frame of the program's own code: the line to fix.
"""

from __future__ import annotations

import re

from orchestrator.analyze.model_outcome import StackClassOut
from orchestrator.ranklist import ranges
from orchestrator.store.evidence import StackClass

_FRAME = re.compile(r"^(?P<file>.*):(?P<line>\d+) \((?P<func>.*)\)$")
# Frames that are not the program's own: the interpreter's standard library, installed packages,
# orch's hook.
_STDLIB = re.compile(r"/lib/python3\.\d+/(?!site-packages/|dist-packages/)")
_PACKAGES = ("/site-packages/", "/dist-packages/")
_HOOK = "/pyhooks/sitecustomize.py"
# torch's wrappers around a collective, which say nothing of which one it is.
_WRAPPERS = {"wrapper", "inner", "_fn", "decorate_context"}


def _parts(frame: str) -> tuple[str, str, str]:
    m = _FRAME.match(frame)
    return (m["file"], m["line"], m["func"]) if m else (frame, "", "")


def _torch(file: str, sub: str) -> bool:
    return f"/torch/{sub}" in file.replace("\\", "/")


def program_frame(frames: list[str]) -> str:
    """The innermost frame of the program's own code (`file:line (function)`): outside the
    standard library, installed packages and orch's hook; else outside torch and the standard
    library; else the innermost frame."""
    def own(f: str) -> bool:
        file = _parts(f)[0]
        return not (_STDLIB.search(file) or any(p in file for p in _PACKAGES) or file.endswith(_HOOK))

    def not_torch(f: str) -> bool:
        file = _parts(f)[0]
        return not (_STDLIB.search(file) or "/torch/" in file or file.endswith(_HOOK))

    return next((f for f in frames if own(f)), None) or next((f for f in frames if not_torch(f)), None) \
        or (frames[0] if frames else "")


def waits_in(frames: list[str]) -> str:
    """What the stack waits for peers in, in words, or "" where it does not: a torch.distributed
    call (its name), backward (DDP's gradient all-reduce), a CUDA synchronisation."""
    for f in frames:
        file, _, func = _parts(f)
        if _torch(file, "distributed/") and not _torch(file, "distributed/elastic/") and func not in _WRAPPERS:
            return f"torch.distributed {func}"
        if _torch(file, "autograd/"):
            return "backward (DDP's gradient all-reduce waits there)"
        if _torch(file, "cuda/") and "synchronize" in func:
            return f"a CUDA {func}"
    return ""


def _short(frame: str) -> str:
    """`folder/file:line (function)`: the last two parts of the path, as the stacks are shown."""
    file, line, func = _parts(frame)
    return f"{'/'.join(file.replace(chr(92), '/').split('/')[-2:])}:{line} ({func})" if line else frame


def classes(kept: list[StackClass]) -> list[StackClassOut]:
    """The classes as the report shows them: count, ranks, the program's frame, where inside it the
    stack was (its innermost frame) and what it waited in."""
    return [StackClassOut(count=len(c.ranks), ranks=c.ranks, frame=program_frame(c.frames),
                          innermost=_short(c.frames[0]) if c.frames else "", waits=waits_in(c.frames))
            for c in kept]


def root(out: list[StackClassOut]) -> list[int]:
    """The ranks elsewhere while most wait at one point: the waiting class with the most ranks
    (the crowd) holds at least as many ranks as all the others together, no other class is as
    large unless it does not wait, and every other rank is elsewhere (not in the crowd's class,
    whether it waits in no collective or in another one). [] where the stacks do not decide (one
    class, two waiting classes alike, no crowd)."""
    if len(out) < 2:
        return []
    crowd = max((c for c in out if c.waits), key=lambda c: c.count, default=None)
    if crowd is None:
        return []
    others = [c for c in out if c is not crowd]
    if sum(c.count for c in others) > crowd.count:
        return []
    if any(c.count == crowd.count and c.waits for c in others):
        return []  # two points where as many ranks wait: nothing tells which is the odd one
    return sorted(r for c in others for r in c.ranks)


def mark(out: list[StackClassOut], late: list[int]) -> list[StackClassOut]:
    """The classes with the root's (the ranks named behind, whatever evidence named them) marked."""
    return [c.model_copy(update={"root": bool(set(c.ranks) & set(late))}) for c in out]


def line(out: list[StackClassOut], limit: int = 6) -> str:
    """The classes in one line: `main-thread stacks: 3 rank(s) 0-2 waiting in backward ... at
    f.py:52 (step); 1 rank(s) 3 at f.py:44 (step) (the root)`."""
    if len(out) < 2:
        return ""
    said = [f"{c.count} rank(s) {ranges(c.ranks)}"
            + (f" waiting in {c.waits}" if c.waits else f" in {c.innermost}" if c.innermost != _short(c.frame) else "")
            + f" at {c.frame}" + (" (the root)" if c.root else "") for c in out[:limit]]
    more = f"; {len(out) - limit} more class(es)" if len(out) > limit else ""
    return "main-thread stacks: " + "; ".join(said) + more
