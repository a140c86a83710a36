"""`orch collect`: gather -> probe -> identify -> ingest, under a per-run lock.

Map/reduce in the nsys-recipes style: every rank is exported and probed independently (map),
then all ranks are merged into one DuckDB store on one clock (reduce).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from orchestrator.collect.gather import (
    ReportFile,
    Started,
    discover,
    export_all,
    export_workers,
    exports_dir,
    find_nsys,
)
from orchestrator.collect.identity import Member, identify, infer_world_size
from orchestrator.collect.ingest import writing_store
from orchestrator.collect.probe import Probe, probe
from orchestrator.collect.timings import phase
from orchestrator.errors import OrchError
from orchestrator.layout import Layout
from orchestrator.rundir import STORE


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

    @property
    def ok_ranks(self) -> list[int]:
        """Ranks whose data is in the store (status ok or partial)."""
        return sorted(m.rank for m in self.members if m.rank is not None and m.status == "ok"
                      and not m.probe.error)

    @property
    def bad(self) -> list[Member]:
        return [m for m in self.members if m.probe.error or m.status != "ok"]


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


def _progress(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=True,
                    disable=not console.is_terminal)


def _complete_layout(layout: Layout, members: list[Member], warnings: list[str]) -> Layout:
    """A partial --layout (dp left out, world size unknown until now) gets dp from the ranks
    found; when tp*pp does not divide that, one-line error instead of dropping stages."""
    if not layout.known or layout.dp is not None:
        return layout
    world = infer_world_size(members)
    if world is None:  # no readable rank: nothing to place
        return layout
    layout = layout.resolve(world, source="--layout")
    warnings.append(f"layout: dp={layout.dp} inferred from a world size of {world} (highest rank found + 1); "
                    "pass dp in --layout if ranks are missing")
    return layout


def collect(paths: list[Path], run: Path, **kw: Any) -> CollectResult:
    """Collect the reports under `paths` into `run`'s store (`collecting`, store closed)."""
    with collecting(paths, run, **kw) as (res, _):
        return res


@contextmanager
def collecting(
    paths: list[Path], run: Path, *, layout: Layout, expected: list[int] | None = None,
    name_prefix: str | None = None, nsys: str | None = None, workers: int | None = None,
    keep_env: bool = False, engine: str = "auto", align: bool = False,
    console: Console | None = None, extra_meta: dict[str, object] | None = None,
    started: dict[Path, Started] | None = None, background: bool = False,
) -> Iterator[tuple[CollectResult, duckdb.DuckDBPyConnection]]:
    """Collect the reports under `paths` into `run`'s store and hold the store open for the
    block (ingest.writing_store): the block gets the result and the writer's connection (the
    store attached as `store`); the store is in place when the block ends, also when it fails.
    `started`: exports already running (gather.early_exports), taken over by the export step;
    `background`: checkpoint during the block (an analysis of the store in this process)."""
    console = console or Console(stderr=True)
    workers = export_workers(workers)
    with run_lock(run), ExitStack() as held:
        reports: list[ReportFile] = discover(paths, name_prefix)
        if not reports:
            where = ", ".join(str(p) for p in paths)
            raise OrchError(f"no reports (.nsys-rep, .sqlite, .sqlite.gz) found in {where}; "
                            "check the path or wait for the job to finish writing them")
        with _progress(console) as prog:
            t = prog.add_task("export", total=len(reports))
            with phase("collect: export/decompress"):
                export_all(reports, exports_dir(run), nsys=find_nsys(nsys), workers=workers,
                           on_done=lambda _r: prog.advance(t), started=started)
            t2 = prog.add_task("probe", total=len(reports))

            def probe_one(r: ReportFile) -> Probe:
                pr = probe(r.sqlite) if r.sqlite else Probe(path=r.origin, error=r.error or "no export")
                prog.advance(t2)
                return pr

            # Serially: a probe is a few small SQLite reads, bound by the GIL, not the disk.
            # Threads only fought over the GIL: 128 ranks on a 16-core node took 0.2 s on one
            # thread, 0.3-2.2 s on eight (docs/benchmarks-profile.md, seventh round).
            with phase("collect: probe"):
                probes = [probe_one(r) for r in reports]
            members, warnings = identify(reports, probes)
            ranks = [m.rank for m in members if m.rank is not None]
            layout = _complete_layout(layout, members, warnings)
            if layout.world_size:
                for m in members:
                    if m.rank is not None and m.rank >= layout.world_size:
                        m.notes.append(f"rank {m.rank} is outside the world size {layout.world_size}")
            t3 = prog.add_task("ingest", total=sum(1 for m in members if not m.probe.error))
            with phase("collect: build store (total)"):
                written = held.enter_context(writing_store(
                    members, run / STORE, layout=layout, keep_env=keep_env, engine=engine, workers=workers,
                    align=align, expected=expected, extra_meta=extra_meta, on_rank=lambda _m: prog.advance(t3),
                    background=background))
        exp = set(expected or [])
        ok = {m.rank for m in members if m.rank is not None and not m.probe.error and m.status == "ok"}
        yield CollectResult(
            store=run / STORE, engine=written.engine, members=members, warnings=warnings,
            missing=sorted(exp - ok) if expected is not None else [],
            extra=sorted(set(ranks) - exp) if expected is not None else [],
        ), written.con
