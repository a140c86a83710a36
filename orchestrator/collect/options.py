"""What one collect is asked to do, whichever route writes its rows: every caller (the CLI,
`orch analyze`, `orch sweep`, the Python API, the tests) fills one `CollectOptions` instead of
passing a dozen keywords down through each layer."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.layout import Layout

if TYPE_CHECKING:
    from rich.console import Console

    from orchestrator.collect.gather import Started
    from orchestrator.submit.array import ArrayOptions


@dataclass
class CollectOptions:
    """`layout`: the job's shape (a partial one gets dp from the ranks found); `expected`: the
    ranks the job profiled (the others are reported missing or extra); `name_prefix`: only
    reports whose name starts with it; `nsys`: the binary for `nsys export`; `workers`:
    parallel exports/ingests; `keep_env`: the whole captured environment (secrets);
    `engine`: auto | scanner | sqlite3; `align`: align clocks on matched NCCL kernels;
    `extra_meta`: more keys for the store's meta table. Route: `parts` maps every report to
    Parquet parts in a local pool, `array` in a Slurm job array (implies parts); `summaries`:
    the map also computes each rank's per-rank statistics (store/map_tables.py); None: in a
    Slurm array only, where the maps run on the cluster's nodes (in a local pool a small rank's
    statistics cost the map more than they save the analysis: docs/scale.md); otherwise
    in process, where `started` are exports already running (gather.early_exports) and
    `background` checkpoints while the caller analyses the open store. `copy_events`: the
    parts route copies every event table into the store instead of leaving the large ones in
    the parts, read through views (store/views.py); `view_min_rows`: how large "large" is,
    in rows a part file on average (None: views.VIEW_MIN_ROWS; the tests force views with 0)."""

    layout: Layout = field(default_factory=Layout)
    expected: list[int] | None = None
    name_prefix: str | None = None
    nsys: str | None = None
    workers: int | None = None
    keep_env: bool = False
    engine: str = "auto"
    align: bool = False
    console: Console | None = None
    extra_meta: dict[str, object] | None = None
    parts: bool = False
    array: ArrayOptions | None = None
    started: dict[Path, Started] | None = None
    background: bool = False
    summaries: bool | None = None
    copy_events: bool = False
    view_min_rows: int | None = None

    @property
    def map_reduce(self) -> bool:
        """The Parquet-parts route (its own workers export; nothing is started early)."""
        return self.parts or self.array is not None
