"""The in-process row writer: every report exported (or decompressed) and probed here, then
all ranks ingested straight into the store's DuckDB tables by this process's workers
(ingest.writing_store), the store held open for an analysis in the same process."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from rich.console import Console

from orchestrator import progress
from orchestrator.collect.gather import ReportFile, export_all, export_workers, exports_dir, find_nsys
from orchestrator.collect.identity import Member, identify
from orchestrator.collect.ingest import writing_store
from orchestrator.collect.options import CollectOptions
from orchestrator.collect.pipeline import Written
from orchestrator.collect.probe import Probe, probe
from orchestrator.layout import Layout
from orchestrator.timings import phase


class DirectRows:
    """RowWriter of the default route (`orch collect`, `orch analyze`)."""

    def __init__(self, run: Path, opts: CollectOptions, console: Console) -> None:
        self.run, self.opts, self.console = run, opts, console
        self.workers = export_workers(opts.workers)

    def read(self, reports: list[ReportFile]) -> tuple[list[Member], list[str]]:
        """Export every report (taking over `opts.started`), probe each, identify the ranks."""
        nodes = [r.host for r in reports]
        with progress.task("export", total=len(reports), nodes=nodes) as t, phase("collect: export/decompress"):
            export_all(reports, exports_dir(self.run), nsys=find_nsys(self.opts.nsys), workers=self.workers,
                       on_done=lambda r: t.advance(node=r.host), started=self.opts.started)
        with progress.task("probe", total=len(reports)) as t2:

            def probe_one(r: ReportFile) -> Probe:
                pr = probe(r.sqlite) if r.sqlite else Probe(path=r.origin, error=r.error or "no export")
                t2.advance()
                return pr

            # Serially: a probe is a few small SQLite reads, bound by the GIL, not the disk, so
            # threads only fight over the GIL and are slower than one (docs/benchmarks-code.md).
            with phase("collect: probe"):
                probes = [probe_one(r) for r in reports]
        return identify(reports, probes)

    @contextmanager
    def write(self, members: list[Member], store: Path, layout: Layout) -> Iterator[Written]:
        """Ingest every readable rank and hold the store open (ingest.writing_store)."""
        o = self.opts
        with ExitStack() as held:
            with progress.task("ingest", total=sum(1 for m in members if not m.probe.error)) as t3, \
                    phase("collect: build store (total)"):
                written = held.enter_context(writing_store(
                    members, store, layout=layout, keep_env=o.keep_env, engine=o.engine, workers=self.workers,
                    align=o.align, expected=o.expected, extra_meta=o.extra_meta,
                    on_rank=lambda _m: t3.advance(), background=o.background))
            yield written
