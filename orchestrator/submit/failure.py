"""Why a task of a torchrun job failed, in one line, from what its launch printed.

A failed node's torchrun ends its output with every local rank's outcome and names the first
one to fail ("Root Cause (first observed failure)"); the other nodes' torchruns only say they
were stopped (SIGTERM from srun). The last line of that output, which `orch status` used to
show, is a row of '=' on the failing node and `SignalException ... got signal: 15` on the
others: neither names the rank nor says what went wrong. Read here, the row says which rank
failed first, with what status, and the rank's own last words: orch's rank wrapper's message
(nsys could not start) or the exception line of the rank's Python traceback; `rank_traceback`
gives that traceback itself, which `orch status` prints instead of the launcher's log tail.

torchrun's root cause is the failure with the smallest timestamp, in whole seconds, ties going
to the lowest local rank: when rank 1 raises and rank 0, waiting for it in a collective, fails a
moment later with "Connection closed by peer", both are stamped the same second and torchrun
names rank 0. A rank whose own error says it lost a peer (a closed or reset connection, NCCL's
remote error or abort, a collective's timeout, torchrun's SIGTERM) is a victim; the first failure
is the first in torchrun's order whose error does not say so, and torchrun's root when all do.
"""

from __future__ import annotations

import re
import signal

_ROOT = re.compile(r"Root Cause \(first observed failure\):[ \t]*\n\[\d+\]:[ \t]*\n((?:[ \t]+[^\n]*\n?)+)")
_OTHERS = re.compile(r"^Failures:[ \t]*$", re.M)
_BLOCK = re.compile(r"^\[\d+\]:[ \t]*\n((?:[ \t]+[^\n]*\n?)+)", re.M)
# What a rank says when it failed because another rank went away or never came: gloo's and the
# TCP store's socket errors, NCCL's remote error, abort and watchdog timeout, a collective's
# timeout, and torchrun stopping the rank.
_PEER_LOST = re.compile(
    r"Connection (?:closed|reset) by peer|Broken pipe|remote process exited|ncclRemoteError"
    r"|NCCL communicator was aborted|Watchdog caught collective operation timeout"
    r"|Some NCCL operations have failed or timed out|DistNetworkError|failed to recv"
    r"|Timed out waiting|SignalException", re.I)
_FIELD = re.compile(r"^\s+(\w[\w ]*?)\s*:\s?(.*?)\s*$")
_STOPPED = re.compile(r"SignalException: Process \d+ got signal: (\d+)")
_TAG = re.compile(r"^\[rank(\d+)\]: ?(.*)$")
_WRAPPER = re.compile(r"^orch: rank (\d+): (.*)$", re.M)
# The wrapper's notes on a rank that went on: nsys failed or hung as it started and is started
# again, or nsys exited while its program ran on. What the rank did after them (its traceback)
# is how it ended.
_WRAPPER_NOTE = re.compile(r"starting it again$|waiting for the program|started no program in")
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


def _fields(block: str) -> dict[str, str]:
    return {f.group(1).strip(): f.group(2) for f in map(_FIELD.match, block.splitlines()) if f}


def _failures(text: str) -> list[dict[str, str]]:
    """torchrun's failure records: its root cause first, then the other failures it listed."""
    m = _ROOT.search(text)
    if not m:
        return []
    heads = list(_OTHERS.finditer(text, 0, m.start()))
    others = [_fields(b.group(1)) for b in _BLOCK.finditer(text, heads[-1].end(), m.start())] if heads else []
    return [_fields(m.group(1)), *others]


def _rank(fields: dict[str, str]) -> str:
    return (fields.get("rank", "?").split() or ["?"])[0]


def _words(text: str, fields: dict[str, str], root: bool, aborted_alone: bool = False) -> str | None:
    """A failed rank's own last words: orch's wrapper's message that ended it (nsys never
    started), else its exception line; for torchrun's root also an untagged traceback or a C++
    abort's message (neither names a rank); the abort's message too for the one rank that
    ended by SIGABRT (`aborted_alone`: std::terminate aborts, so it is that rank's, whichever
    rank torchrun saw fail first); else the wrapper's last note on it."""
    rank = _rank(fields)
    said = [m.group(2) for m in _WRAPPER.finditer(text) if m.group(1) == rank]
    ended = [s for s in said if not _WRAPPER_NOTE.search(s)]
    block = _own(text, rank, untagged=root and not _killed(fields))
    native = _native(text) if root or aborted_alone else []
    own = ended[-1:] or ([block[-1].strip()] if block else []) or native or said[-1:]
    return own[0] if own else None


def _code(fields: dict[str, str]) -> int | None:
    try:
        return int(fields.get("exitcode", "?").split()[0])
    except (ValueError, IndexError):
        return None


def _aborted(fields: dict[str, str]) -> bool:
    """The rank ended by SIGABRT (what std::terminate sends after a C++ exception nobody caught)."""
    return _code(fields) in (-6, 134)


def _killed(fields: dict[str, str]) -> bool:
    """The rank ended by SIGKILL: it printed nothing as it died, so an untagged traceback in the
    output is another rank's (one whose connection to it broke while it still set up)."""
    return _code(fields) in (-9, 137)


def _stopped(fields: dict[str, str]) -> bool:
    """torchrun (or Slurm) stopped the rank: it ended by SIGTERM."""
    return _code(fields) in (-15, 143)


def _lost_peer(fields: dict[str, str], words: str | None) -> bool:
    """The rank failed because another went away: its error says so, or, silent, it was stopped."""
    return bool(_PEER_LOST.search(words)) if words else _stopped(fields)


def _first(text: str) -> tuple[dict[str, str], str | None, bool] | None:
    """(fields, own words, lost its peer) of the rank that failed first, None when `text` is not
    a failed torchrun's output. A rank torchrun stopped may have raised first: under nsys, a
    rank's process ends only once nsys wrote its report, so the rank that lost its peer can end
    first; its own traceback tells."""
    failures = _failures(text)
    aborted = [f for f in failures if _aborted(f)]
    seen = [(f, _words(text, f, i == 0, aborted == [f])) for i, f in enumerate(failures)]
    seen = [(f, w, _lost_peer(f, w)) for f, w in seen]
    return next((s for s in seen if not s[2]), seen[0]) if seen else None


def _how(fields: dict[str, str], lost: bool) -> str:
    """torchrun's exit code in words; '' for a rank it stopped after the rank had failed on its
    own (the stop is not how it failed)."""
    return "" if _stopped(fields) and not lost else _status(fields.get("exitcode", "?"))


def first_words(rank: int | str, how: str) -> str:
    """'rank R failed first (how)', without the parentheses when how it ended is not known."""
    return f"rank {rank} failed first" + (f" ({how})" if how else "")


def _own(text: str, rank: str, untagged: bool = True) -> list[str] | None:
    """The failing rank's traceback: its `[rankN]:` lines, else (`untagged`) the first untagged one."""
    blocks = _tracebacks(text)
    mine = [b for r, b in blocks if r == rank] or [b for r, b in blocks if r is None and untagged]
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
    """One line saying why this task failed, or None when its output is not a torchrun's: the
    rank's words cut at 300 characters, then the note on torchrun's own root, which takes
    nothing from them (a native error's message says its cause last)."""
    first = _first(text)
    if first is not None:
        fields, own, lost = first
        head = first_words(_rank(fields), _how(fields, lost))
        named = _rank(_failures(text)[0])
        note = f" (torchrun names rank {named}, which lost its peer)" if named != _rank(fields) else ""
        return f"{head}: {own}"[:300] + note if own else head + note
    stopped = _STOPPED.search(text)
    if stopped:
        return (f"stopped by {_signal(int(stopped.group(1)))}: another node's rank failed, "
                "or the job was cancelled or ran out of time")
    return None


def _native(text: str) -> list[str]:
    """The uncaught C++ exception's type and message, without the source location it opens with."""
    m = _NATIVE.search(text)
    return [f"{m.group(1)}: {_LOCATION.sub('', m.group(2).strip())}"] if m else []


def root_cause(text: str) -> tuple[int, str, bool] | None:
    """(rank, how it ended in words or '', whether it only lost its peer) of the rank that
    failed first; the third says another node's failure is the likelier root."""
    first = _first(text)
    if first is None:
        return None
    fields, _, lost = first
    try:
        return int(_rank(fields)), _how(fields, lost), lost
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
    first = _first(text)
    if first is None:
        return None
    block = _own(text, _rank(first[0]), untagged=not _killed(first[0]))
    return "\n".join(block[-lines:]) if block else None
