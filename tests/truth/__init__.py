"""Ground truth of every real capture in tests/fixtures, computed without orch: what was planted
(the workload's own arguments), what plain sqlite3 counts over the exports (steps, memory peaks)
and what a pair of runs measured (the time a fix saves). `python -m tests.truth` writes one JSON
file per case into tests/fixtures/truth/, which `scripts/scoreboard.py` judges orch's reports by.

Each family of fixtures has its module here (`pairs`, ...) with a `cases()` that yields `Truth`s;
nothing here imports orchestrator."""

from __future__ import annotations

import gzip
import lzma
import re
import shutil
import sqlite3
import statistics
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tests.independent import memory_levels

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TRUTH = FIXTURES / "truth"

# What a case's cause may be: the scoreboard maps each to the finding kinds that name it.
CAUSES = ("none", "gpu-compute", "cpu", "input", "stage", "host-sync", "launch", "pageable-copy",
          "allocator-churn", "memory-growth", "slow-link", "graph-shapes", "hang", "crash", "oom", "kill", "cancel",
          "divergence")


@dataclass
class Truth:
    """What is true of one capture. `root` is the ranks whose fix saves the time (all ranks for a
    cause every rank shares, none for a healthy run); `saving_ms` what the analysed steps take
    less with it fixed, measured (in the captures, or their loops' own timings where no capture of
    the fix was made); `saving_unprofiled_ms` the same without the profiler, where both were
    measured (judged against a finding's own estimate without the profiler, where it gives one);
    `steps` the steps the capture holds; `peak_bytes` each rank's highest GPU memory in use;
    `function` the Python function the time goes in, where the cause is the user's code (the top
    finding must name it). None: not known for this case, not judged. `how` says, per field, how
    it was found."""

    case: str
    about: str
    input: dict
    cause: str
    root: list[int] = field(default_factory=list)
    outcome: str = "completed"
    saving_ms: float | None = None
    saving_unprofiled_ms: float | None = None
    steps: int | None = None
    peak_bytes: dict[int, int] | None = None
    function: str | None = None
    how: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.cause not in CAUSES:
            raise ValueError(f"{self.case}: cause {self.cause!r} is not one of {CAUSES}")
        self.root = sorted(self.root)
        if self.saving_ms is not None:
            self.saving_ms = round(self.saving_ms, 1)
        if self.saving_unprofiled_ms is not None:
            self.saving_unprofiled_ms = round(self.saving_unprofiled_ms, 1)

    def as_json(self) -> dict:
        d = asdict(self)
        if self.peak_bytes is not None:
            d["peak_bytes"] = {str(k): v for k, v in sorted(self.peak_bytes.items())}
        return d


def export_files(spec: dict) -> list[Path]:
    """The compressed exports a case's input names: a run directory's exports/, or listed files."""
    if "run" in spec:
        return sorted((FIXTURES / spec["run"] / "exports").glob("*.sqlite.*"))
    return [FIXTURES / f for f in spec["exports"]]


def _rank(con: sqlite3.Connection, name: str) -> int:
    """The rank of one export: torchrun's RANK in the captured environment, else the `_r<N>_` of
    its file name."""
    have = con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'META_DATA_CAPTURE'").fetchone()[0]
    if have:
        row = con.execute("SELECT value FROM META_DATA_CAPTURE WHERE value LIKE 'RANK=%'").fetchone()
        if row:
            return int(row[0].split("=", 1)[1].strip('"'))
    m = re.search(r"_r(\d+)_", name)
    if not m:
        raise ValueError(f"{name}: no rank in its captured environment or its name")
    return int(m.group(1))


@contextmanager
def opened(spec: dict, tmp: Path) -> Iterator[dict[int, sqlite3.Connection]]:
    """Per rank, a sqlite3 connection to its export, decompressed (gzip or xz) into `tmp`."""
    cons: dict[int, sqlite3.Connection] = {}
    try:
        for src in export_files(spec):
            dest = tmp / src.name.rsplit(".", 1)[0]
            if not dest.exists():
                with (lzma.open if src.suffix == ".xz" else gzip.open)(src, "rb") as fi, open(dest, "wb") as fo:
                    shutil.copyfileobj(fi, fo)
            con = sqlite3.connect(dest)
            cons[_rank(con, src.name)] = con
        yield dict(sorted(cons.items()))
    finally:
        for con in cons.values():
            con.close()


def range_starts(con: sqlite3.Connection, like: str) -> list[int]:
    """Start times of the NVTX ranges whose text is LIKE `like`, in time order."""
    return [r[0] for r in con.execute(
        "SELECT e.start FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
        "WHERE coalesce(e.text, s.value) LIKE ? ORDER BY e.start", (like,))]


def range_ends(con: sqlite3.Connection, like: str) -> list[int]:
    """End times of the NVTX ranges whose text is LIKE `like` and that ended, in time order."""
    return [r[0] for r in con.execute(
        "SELECT e.\"end\" FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
        "WHERE coalesce(e.text, s.value) LIKE ? AND e.\"end\" IS NOT NULL ORDER BY e.\"end\"", (like,))]


def span_ms(cons: dict[int, sqlite3.Connection], like: str, first: int = 1) -> float:
    """ms from the `first`-th range LIKE `like` to the last one's start, the mean over the ranks:
    what the steps after the first took, whatever their lengths."""
    spans = []
    for con in cons.values():
        s = range_starts(con, like)
        spans.append((s[-1] - s[first]) / 1e6)
    return statistics.mean(spans)


def step_count(cons: dict[int, sqlite3.Connection], like: str) -> int:
    """The number of ranges LIKE `like` a rank holds, the same on every rank (else an error)."""
    counts = {r: len(range_starts(c, like)) for r, c in cons.items()}
    if len(set(counts.values())) != 1:
        raise ValueError(f"ranks hold different step counts: {counts}")
    return next(iter(counts.values()))


def levels(con: sqlite3.Connection) -> list[tuple[int, int]]:
    """[(time, bytes in use after it)] of one rank, in time order, on its device
    (tests/independent.memory_levels: the same rule the other tests' oracle uses)."""
    return memory_levels(con)[1]


def peaks(cons: dict[int, sqlite3.Connection]) -> dict[int, int]:
    """Per rank, the highest bytes in use on its device (`levels`)."""
    return {rank: max(level for _, level in levels(con)) for rank, con in cons.items()}


def write(truths: list[Truth]) -> None:
    """One JSON file per case in tests/fixtures/truth/."""
    import json

    TRUTH.mkdir(exist_ok=True)
    for t in truths:
        (TRUTH / f"{t.case}.json").write_text(json.dumps(t.as_json(), indent=1) + "\n")
