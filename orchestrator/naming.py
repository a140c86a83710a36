"""Report file names: the one home of the nsys `-o` format orch renders and of its parse.

orch's reports are `<output_name>_<jobid>_r<RANK>_<host>.<pid>.nsys-rep` (nsys expands
`%q{VAR}`, `%h` and `%p` per process, so job id, global rank, host and pid make every name
unique across nodes and restarts). Reports from the seed-style sbatch are `<name>_<host>.<pid>`.
Render writes the format, submit expects it, collect parses it: all through this module.

Numbers in a file name are data from outside (a user can name a file anything): they are
parsed and range-checked by `orchestrator.numbers` (the one place for such numbers), and a
value out of range counts as absent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from orchestrator import numbers

# What the store's rank (INTEGER) and pid (BIGINT) columns hold.
MAX_RANK = numbers.INT32_MAX
MAX_PID = numbers.INT64_MAX
REPORT_SUFFIX = ".nsys-rep"

_RANK_HOST_PID = re.compile(r"_r(?P<rank>[0-9]+)_(?P<host>[^/]+)\.(?P<pid>[0-9]+)$")
_HOST_PID = re.compile(r"_(?P<host>[^_/]+)\.(?P<pid>[0-9]+)$")


def report_stem(output_name: str) -> str:
    """The nsys `-o` value (without directory and suffix) every profiled rank gets."""
    return f"{output_name}_%q{{ORCH_JOB_ID}}_r%q{{RANK}}_%h.%p"


def name_prefix(output_name: str, job_id: str) -> str:
    """What every report of one job starts with: collect ignores other files in the folder."""
    return f"{output_name}_{job_id}_r"


def expected_glob(output_name: str, job_id: str, rank: int) -> str:
    """Glob for one rank's report (host and pid are only known once it ran)."""
    return f"{name_prefix(output_name, job_id)}{rank}_*{REPORT_SUFFIX}"


@dataclass(frozen=True)
class ReportName:
    """What a report's file name says; any part may be unknown."""

    rank: int | None = None
    host: str | None = None
    pid: int | None = None
    problems: tuple[str, ...] = ()  # numbers in the name that were out of range (then None)


def parse(stem: str) -> ReportName:
    """`..._r<RANK>_<host>.<pid>` or `..._<host>.<pid>` -> ReportName (rank/pid None when
    absent or out of range)."""
    m = _RANK_HOST_PID.search(stem) or _HOST_PID.search(stem)
    if not m:
        return ReportName()
    problems = []
    rank, bad = numbers.optional(numbers.rank, m.groupdict().get("rank"), "rank in the file name")
    if bad:
        problems.append(f"{bad}: ignored")
    pid, bad = numbers.optional(lambda v, w: numbers.parse_int(v, w, 0, MAX_PID), m["pid"], "pid in the file name")
    if bad:
        problems.append(f"{bad}: not stored")
    return ReportName(rank, m["host"], pid, tuple(problems))
