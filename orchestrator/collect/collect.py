"""The collect's entry points for reports given by path: the one pipeline (pipeline.py) with
the row writer that `CollectOptions` asks for, in process (direct.py) or over Parquet parts
(mapreduce.py). A submitted job's run goes through `run.collect_run`, which fills the
options from its manifest and calls these.

Map/reduce in the nsys-recipes style: every rank is exported and probed independently (map),
then all ranks are merged into one DuckDB store on one clock (reduce).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import duckdb
from rich.console import Console

from orchestrator.collect.direct import DirectRows
from orchestrator.collect.mapreduce import PartsRows
from orchestrator.collect.options import CollectOptions
from orchestrator.collect.pipeline import CollectResult, RowWriter, run_lock, run_pipeline

__all__ = ["CollectOptions", "CollectResult", "collect", "collect_parts", "collecting", "run_lock"]


def _options(opts: CollectOptions | None, kw: dict[str, Any]) -> CollectOptions:
    """`opts`, or the options spelled as keywords (the Python API's and the tests' shorthand)."""
    return replace(opts, **kw) if opts is not None else CollectOptions(**kw)


def writer_for(run: Path, opts: CollectOptions, console: Console) -> RowWriter:
    """The row writer of the route `opts` asks for."""
    return (PartsRows if opts.map_reduce else DirectRows)(run, opts, console)


@contextmanager
def collecting(paths: list[Path], run: Path, opts: CollectOptions | None = None,
               **kw: Any) -> Iterator[tuple[CollectResult, duckdb.DuckDBPyConnection | None]]:
    """Collect the reports under `paths` into `run`'s store and hold the store for the block:
    the block gets the result and the writer's connection (the store attached as `store`;
    None on the Parquet-parts route, whose store is closed); the store is in place when the
    block ends, also when it fails."""
    o = _options(opts, kw)
    console = o.console or Console(stderr=True)
    with run_pipeline(paths, run, o, writer_for(run, o, console)) as held:
        yield held


def collect(paths: list[Path], run: Path, opts: CollectOptions | None = None, **kw: Any) -> CollectResult:
    """Collect the reports under `paths` into `run`'s store (`collecting`, store closed)."""
    with collecting(paths, run, opts, **kw) as (res, _):
        return res


def collect_parts(paths: list[Path], run: Path, opts: CollectOptions | None = None, **kw: Any) -> CollectResult:
    """`collect` over Parquet parts mapped in a local process pool (`--parts`)."""
    return collect(paths, run, _options(opts, {**kw, "parts": True}))
