"""The one collect pipeline: discover -> export -> probe -> identify -> write rows -> finalize,
under a per-run lock. The two routes differ only in the `RowWriter` they plug in: the
in-process writer (direct.py) exports, probes and ingests every rank straight into DuckDB;
the Parquet-parts writer (mapreduce.py) maps each report to parts in its own workers (a
local pool or a Slurm array), then reduces them. Both identify the ranks across all reports
with `identity.identify` and finish the store with `finalize.finalize_store`, so both give
the same store; everything around them (finding the reports, completing the layout, the
result) is here, once.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import duckdb

from orchestrator.collect.gather import ReportFile, discover
from orchestrator.collect.identity import Member, infer_world_size
from orchestrator.collect.options import CollectOptions
from orchestrator.errors import OrchError
from orchestrator.layout import Layout
from orchestrator.runpaths import STORE


@dataclass
class CollectResult:
    store: Path
    engine: str
    members: list[Member]
    missing: list[int] = field(default_factory=list)
    extra: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    mapped: int = 0  # --parts/--on-cluster: reports mapped by this run
    reused: int = 0  # --parts/--on-cluster: reports whose parts were fresh
    failed_tasks: list[Any] = field(default_factory=list)  # --on-cluster: array tasks not COMPLETED
    views: list[str] = field(default_factory=list)  # parts route: event tables the store reads from the parts

    @property
    def ok_ranks(self) -> list[int]:
        """Ranks whose data is in the store (status ok or partial)."""
        return sorted(m.rank for m in self.members if m.rank is not None and m.status == "ok"
                      and not m.probe.error)

    @property
    def bad(self) -> list[Member]:
        return [m for m in self.members if m.probe.error or m.status != "ok"]


@dataclass
class Written:
    """What a writer leaves open for the pipeline's block: the writer's connection (the store
    attached as `store`; None when the route closes its store first), the engine label, and
    the route's counts for the result (mapped, reused, failed_tasks, views)."""

    con: duckdb.DuckDBPyConnection | None
    engine: str
    counts: dict[str, Any] = field(default_factory=dict)


class RowWriter(Protocol):
    """How the event rows get into the store: `read` turns the reports into identified
    members (exporting and probing them, here or in its own workers); `write` builds the
    store at `store` from them and holds it for the block (finalized, meta written)."""

    def read(self, reports: list[ReportFile]) -> tuple[list[Member], list[str]]: ...

    def write(self, members: list[Member], store: Path, layout: Layout) -> AbstractContextManager[Written]: ...


@contextmanager
def run_lock(run: Path) -> Iterator[None]:
    """One collect per run at a time; a second one fails at once with a clear message.
    flock is released by the kernel if the holder dies (SIGKILL included)."""
    run.mkdir(parents=True, exist_ok=True)
    fd = os.open(run / ".collect.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            raise OrchError(
                f"another `orch collect` (pid {holder}) is working on {run}; wait for it to finish"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


def complete_layout(layout: Layout, members: list[Member], warnings: list[str]) -> Layout:
    """A partial --layout (dp left out, world size unknown until now) gets dp from the ranks
    found; when tp*pp does not divide that, one-line error instead of dropping stages. A rank
    outside the world size is noted on its member."""
    if layout.known and layout.dp is None:
        world = infer_world_size(members)
        if world is not None:  # else no readable rank: nothing to place
            layout = layout.resolve(world, source="--layout")
            warnings.append(f"layout: dp={layout.dp} inferred from a world size of {world} (highest rank found "
                            "+ 1); pass dp in --layout if ranks are missing")
    if layout.world_size:
        for m in members:
            if m.rank is not None and m.rank >= layout.world_size:
                m.notes.append(f"rank {m.rank} is outside the world size {layout.world_size}")
    return layout


@contextmanager
def run_pipeline(paths: list[Path], run: Path, opts: CollectOptions,
                 writer: RowWriter) -> Iterator[tuple[CollectResult, duckdb.DuckDBPyConnection | None]]:
    """Collect the reports under `paths` into `run`'s store through `writer`, and hold the
    store for the block: the block gets the result and the writer's connection (None when
    the route closed the store); the store is in place when the block ends."""
    with run_lock(run):
        reports = discover(paths, opts.name_prefix)
        if not reports:
            where = ", ".join(str(p) for p in paths)
            raise OrchError(f"no reports (.nsys-rep, .sqlite, .sqlite.gz) found in {where}; "
                            "check the path or wait for the job to finish writing them")
        members, warnings = writer.read(reports)
        layout = complete_layout(opts.layout, members, warnings)
        with writer.write(members, run / STORE, layout) as written:
            exp = set(opts.expected or [])
            ok = {m.rank for m in members if m.rank is not None and not m.probe.error and m.status == "ok"}
            ranks = {m.rank for m in members if m.rank is not None}
            known = opts.expected is not None
            yield CollectResult(
                store=run / STORE, engine=written.engine, members=members, warnings=warnings,
                missing=sorted(exp - ok) if known else [], extra=sorted(ranks - exp) if known else [],
                **written.counts,
            ), written.con
