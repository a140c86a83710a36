"""Per-rank columns, declared once on `RankMetrics`' fields: where each value comes from in the
analysis views and how every renderer shows it.

A field of `RankMetrics` is `Annotated[type, Column(...)]`. `analyze/build.py` fills every field
from its view row by name (`x_ms` reads `x_ns` through `units.ms`, any other field the column of
its own name) unless the column says otherwise; the terminal's rank table, the HTML Metrics table
and `orch diff` iterate over the fields that declare `terminal`, `html` or `diff`. So a new
per-rank metric is its SQL in `65_rank_metrics.sql` plus one annotated field. Each view places a
column by its own position (`at`): the three orders differ and must stay as users know them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

Value = Callable[[Any, bool], object]  # (the RankMetrics, --wide) -> what the terminal cell shows


@dataclass(frozen=True)
class Terminal:
    """A column of the terminal's per-rank table: in --wide at `wide`, in the 100-column table at
    `narrow` (None: --wide only). The cell is `value` (default: the field) formatted with `fmt`;
    None shows empty."""

    label: str
    wide: int
    narrow: int | None = None
    fmt: str = ".1f"
    left: bool = False
    value: Value | None = None


@dataclass(frozen=True)
class Html:
    """A column of the HTML Metrics table, at `at`; the cell is the field's value as is."""

    header: str
    at: int


@dataclass(frozen=True)
class Diff:
    """An `orch diff` metric, at `at`: it regresses when it moves the bad way (up when
    `worse_up`) by more than `threshold`, absolute points for percentages, relative for times.
    `missing`: the value when the field is None (reports without it)."""

    at: int
    worse_up: bool
    threshold: float
    kind: Literal["points", "relative"]
    missing: Callable[[Any], float] | None = None


@dataclass(frozen=True)
class Column:
    """One per-rank field: its source (`view`, `source` column: default the field's name, `_ms`
    read as `_ns` and converted; `digits` rounds a value that is not a time) and its renderings."""

    view: str = "rank_metrics"
    source: str | None = None
    digits: int | None = None
    terminal: Terminal | None = None
    html: Html | None = None
    diff: Diff | None = None

    def source_of(self, field: str) -> str:
        return self.source or field.replace("_ms", "_ns")


def columns(model: type[BaseModel]) -> dict[str, Column]:
    """field -> its Column, in field order (fields without one get the default source)."""
    out = {}
    for name, info in model.model_fields.items():
        col = next((m for m in info.metadata if isinstance(m, Column)), None)
        out[name] = col or Column()
    return out


def terminal_columns(model: type[BaseModel], wide: bool) -> list[tuple[str, Terminal]]:
    cols = [(n, c.terminal) for n, c in columns(model).items() if c.terminal is not None]
    shown = [(n, t) for n, t in cols if wide or t.narrow is not None]
    return sorted(shown, key=lambda nt: nt[1].wide if wide else nt[1].narrow or 0)


def html_columns(model: type[BaseModel]) -> list[tuple[str, Html]]:
    return sorted(((n, c.html) for n, c in columns(model).items() if c.html is not None), key=lambda nt: nt[1].at)


def diff_columns(model: type[BaseModel]) -> list[tuple[str, Diff]]:
    return sorted(((n, c.diff) for n, c in columns(model).items() if c.diff is not None), key=lambda nt: nt[1].at)


def top_gap(r: Any, wide: bool) -> str:
    """The range with the most GPU idle and its ms; the name cut to 22 characters unless --wide."""
    gaps = r.gaps_by_range_ms
    if not gaps:
        return ""
    name, ms = max(gaps.items(), key=lambda kv: kv[1])
    if not wide and len(name) > 22:
        name = name[:21] + "…"
    return f"{name} {ms:.1f}"


def waiting(r: Any, wide: bool) -> float:
    """NCCL waiting for another rank: collectives and send/recv together."""
    return r.nccl_wait_ms + r.p2p_wait_ms


def late_of(r: Any, wide: bool) -> str:
    return f"{r.late_count}/{r.collectives}"


def steady_mean_step(r: Any) -> float:
    """The mean of the steady steps, for reports without step statistics."""
    xs = [s.ms for s in r.step_ms if not s.warmup]
    return sum(xs) / len(xs) if xs else 0.0
