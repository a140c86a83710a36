"""Why a task of a torchrun job failed, in one line, from what its launch printed.

A failed node's torchrun ends its output with every local rank's outcome and names the first
one to fail ("Root Cause (first observed failure)"); the other nodes' torchruns only say they
were stopped (SIGTERM from srun). The last line of that output, which `orch status` used to
show, is a row of '=' on the failing node and `SignalException ... got signal: 15` on the
others: neither names the rank nor says what went wrong. Read here, the row says which rank
failed first, with what status, and the rank's own last words: orch's rank wrapper's message
(nsys could not start) or the exception line of the rank's Python traceback; `rank_traceback`
gives that traceback itself, which `orch status` prints instead of the launcher's log tail.
"""

from __future__ import annotations

import re
import signal

_ROOT = re.compile(r"Root Cause \(first observed failure\):[ \t]*\n\[\d+\]:[ \t]*\n((?:[ \t]+[^\n]*\n?)+)")
_FIELD = re.compile(r"^\s+(\w[\w ]*?)\s*:\s?(.*?)\s*$")
_STOPPED = re.compile(r"SignalException: Process \d+ got signal: (\d+)")
_TAG = re.compile(r"^\[rank(\d+)\]: ?(.*)$")
_WRAPPER = re.compile(r"^orch: rank (\d+): (.*)$", re.M)
# A C++ exception nobody caught (gloo's and NCCL's checks): std::terminate prints its type and
# message, then aborts; there is no Python traceback to quote.
_NATIVE = re.compile(r"terminate called after throwing an instance of '([^'\n]+)'\s*\n\s*what\(\):\s*(.+)")
_LOCATION = re.compile(r"^\[[^\]]*\]\s*")
# torchrun's log line for a rank that failed, stamped to the microsecond (glog: MMDD HH:MM:SS.us);
# the Root Cause block's `time` has whole seconds only, too coarse to order two nodes' failures.
_FAILED_AT = re.compile(r"^[EWI](\d{4} \d\d:\d\d:\d\d\.\d+) +\d+ \S+\] failed \(exitcode: ", re.M)
# Frames of torchrun's and submitit's own tracebacks: the launcher reporting, not a rank failing.
_LAUNCHER = ("torch/distributed/run.py", "torch/distributed/elastic/", "submitit/")


def _tracebacks(text: str) -> list[tuple[str | None, list[str]]]:
    """(rank, lines ending with the exception line) of each Python traceback in `text` that is
    not the launcher's; the rank when torch tagged the lines `[rankN]:` (its excepthook does
    for uncaught errors)."""
    out: list[tuple[str | None, list[str]]] = []
    tagged = [_TAG.match(ln) for ln in text.splitlines()]
    lines = [(m.group(1), m.group(2)) if m else (None, ln) for ln, m in zip(text.splitlines(), tagged, strict=True)]
    i = 0
    while i < len(lines):
        rank, line = lines[i]
        if line.startswith("Traceback (most recent call last):"):
            j = i + 1
            while j < len(lines) and lines[j][0] == rank and (lines[j][1][:1].isspace() or not lines[j][1]):
                j += 1
            block = [ln for _, ln in lines[i:j + 1]]
            if j < len(lines) and lines[j][0] == rank and not any(s in ln for ln in block for s in _LAUNCHER):
                out.append((rank, block))
            i = j
        i += 1
    return out


def _root(text: str) -> dict[str, str] | None:
    m = _ROOT.search(text)
    if not m:
        return None
    return {f.group(1).strip(): f.group(2) for f in map(_FIELD.match, m.group(1).splitlines()) if f}


def _own(text: str, rank: str) -> list[str] | None:
    """The failing rank's traceback: its `[rankN]:` lines, else the first untagged one."""
    blocks = _tracebacks(text)
    mine = [b for r, b in blocks if r == rank] or [b for r, b in blocks if r is None]
    return mine[0] if mine else None


def _signal(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


# What a signal usually means when it ends a rank.
_WHY = {"SIGKILL": "out of memory? the OOM killer sends it", "SIGTERM": "stopped: time limit, cancel or another rank",
        "SIGSEGV": "a crash in native code", "SIGABRT": "aborted: a failed check in native code",
        "SIGBUS": "a bad memory access, often /dev/shm full", "SIGINT": "interrupted"}


def exit_words(n: int) -> str:
    """An exit status in words: minus a signal number (Python's, torchrun's) or the shell's
    128 + signal (what a wrapper or nsys passes on) names the signal and what it likely means."""
    if n < 0 or 128 < n < 128 + 65:
        sig = _signal(-n if n < 0 else n - 128)
        notes = [f"exit status {n}"] if n > 0 else []
        notes += [_WHY[sig]] if sig in _WHY else []
        return f"killed by {sig}" + (f" ({'; '.join(notes)})" if notes else "")
    return f"exit status {n}"


def _status(code: str) -> str:
    """torchrun's `exitcode` field: a status, or minus a signal number."""
    try:
        n = int(code.split()[0])
    except (ValueError, IndexError):
        return f"exit status {code}"
    return exit_words(n)


def failure_line(text: str) -> str | None:
    """One line saying why this task failed, or None when its output is not a torchrun's."""
    fields = _root(text)
    if fields is not None:
        rank = fields.get("rank", "?").split()[0]
        said = [m.group(2) for m in _WRAPPER.finditer(text) if m.group(1) == rank]
        block = _own(text, rank)
        own = said[-1:] or ([block[-1].strip()] if block else []) or _native(text)
        head = f"rank {rank} failed first ({_status(fields.get('exitcode', '?'))})"
        return f"{head}: {own[0]}"[:300] if own else head
    stopped = _STOPPED.search(text)
    if stopped:
        return (f"stopped by {_signal(int(stopped.group(1)))}: another node's rank failed, "
                "or the job was cancelled or ran out of time")
    return None


def _native(text: str) -> list[str]:
    """The uncaught C++ exception's type and message, without the source location it opens with."""
    m = _NATIVE.search(text)
    return [f"{m.group(1)}: {_LOCATION.sub('', m.group(2).strip())}"] if m else []


def root_cause(text: str) -> tuple[int, str] | None:
    """(rank, how it ended in words) of the rank torchrun names as the first to fail."""
    fields = _root(text)
    if fields is None:
        return None
    try:
        return int(fields.get("rank", "?").split()[0]), _status(fields.get("exitcode", "?"))
    except ValueError:
        return None


def failed_at(text: str) -> str | None:
    """When torchrun saw its first rank fail ('MMDD HH:MM:SS.us', sortable within a year): on
    several nodes every torchrun names a root cause, and the earliest is the job's (the others
    are ranks that lost their peer)."""
    m = _FAILED_AT.search(text)
    return m.group(1) if m else None


def rank_traceback(text: str, lines: int = 12) -> str | None:
    """The last `lines` lines of the first failing rank's own Python traceback (what the user's
    code raised), or None: shown instead of the launcher's output, which ends every failed task."""
    fields = _root(text)
    if fields is None:
        return None
    block = _own(text, fields.get("rank", "?").split()[0])
    return "\n".join(block[-lines:]) if block else None
