"""The Parquet-parts row writer of the collect pipeline (`orch collect --parts` /
`--on-cluster`): map every report to Parquet parts (a local process pool, or one Slurm job
array through submit/array.py), then reduce the parts into the store.

Incremental: a report whose parts are fresh (made from this very file, see parts.is_fresh)
is not mapped again, so a re-run after a failure maps only what is missing or was replaced.
A report whose map did not finish (its task died) gets an error naming the task, its state
and its log's last line; every other rank is still collected.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing as mp
import os
import signal
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from rich.console import Console

from orchestrator import progress
from orchestrator.collect.decompress import clean_stale
from orchestrator.collect.gather import ReportFile, export_workers, exports_dir, kill_running, stopped_by_term
from orchestrator.collect.identity import Member
from orchestrator.collect.mapper import MapTask, map_chunk, map_chunk_strict
from orchestrator.collect.options import CollectOptions
from orchestrator.collect.parts import PART_TMP, probe_to_json, read_meta, report_to_json, source_stamp
from orchestrator.collect.pipeline import Written
from orchestrator.collect.probe import Probe
from orchestrator.collect.reduce import build_store_from_parts, members_from_metas
from orchestrator.layout import Layout
from orchestrator.runpaths import RunPaths
from orchestrator.store.evidence import JobEvidence
from orchestrator.store.views import IF_MAPPED, VIEW_MIN_ROWS, VIEWABLE

if TYPE_CHECKING:
    from orchestrator.submit.array import TaskOutcome


# prctl(2): the signal a process gets when its parent dies.
_PR_SET_PDEATHSIG = 1


def _stop(signum: int, _frame: FrameType | None) -> None:
    """A map worker's SIGTERM: its exports killed, then the worker, at once (an exception would
    be the pool's to catch and send back, and the worker would wait on for its next report)."""
    kill_running()
    os._exit(128 + signum)


def _map_worker(parent: int) -> None:
    """A map worker ends with the collect that started it. Ctrl-C reaches the whole process
    group, but a SIGTERM or SIGKILL to the collect alone (`timeout`, a scheduler, the OOM killer)
    would leave its workers mapping, then waiting for good on a pipe nobody reads: the kernel
    sends each one SIGTERM when its parent dies (Linux), and the collect sends it when it is
    stopped itself (gather.stopped_by_term). A part it leaves half-written is removed when its
    rank is mapped again."""
    signal.signal(signal.SIGTERM, _stop)
    with contextlib.suppress(OSError, AttributeError):  # not Linux: the collect's own stop only
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the collect died before the request took effect
        _stop(signal.SIGTERM, None)


def _map_local(todo: list[MapTask], workers: int, console: Console) -> dict[str, str]:
    """Map in a pool of `workers` processes (spawned: DuckDB must not be forked); returns
    report id -> error for reports whose worker died."""
    lost: dict[str, str] = {}
    if not todo:
        return lost
    n = max(1, min(workers, len(todo)))
    with stopped_by_term(), progress.task("map", total=len(todo), nodes=[t.report.host for t in todo]) as bar, \
            ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn"), initializer=_map_worker,
                                initargs=(os.getpid(),)) as pool:
        futs = {pool.submit(map_chunk, [t]): t for t in todo}
        for f in as_completed(futs):
            try:
                f.result()
            except Exception as e:  # a worker killed (OOM) or an unexpected bug: that report only
                lost[futs[f].rid] = f"map worker failed: {type(e).__name__}: {str(e)[:200]}"
            bar.advance(node=futs[f].report.host)
    return lost


def _lost_meta(t: MapTask, why: str) -> dict[str, Any]:
    """A report whose map never finished: an error rank, never a silent gap."""
    return {"id": t.rid, "report": report_to_json(t.report), "notes": [], "error": None, "files": {},
            "probe": probe_to_json(Probe(path=t.report.origin, error=why), False)}


def _task_error(o: TaskOutcome) -> str:
    """A task's failure in one line, put on each report of its chunk."""
    last = o.error or (o.log_tail.strip().splitlines() or ["no log"])[-1]
    return f"map task {o.job_id} {o.state}{f' on {o.node}' if o.node else ''}: {last[:200]}"


class PartsRows:
    """RowWriter of `--parts` / `--on-cluster`: `read` maps the reports that have no fresh
    parts (each map exports, probes and writes one report's rows as Parquet) and identifies
    the ranks from their metas; `write` reduces the parts into the store, closed."""

    def __init__(self, run: Path, opts: CollectOptions, console: Console) -> None:
        self.run, self.opts, self.console = run, opts, console
        self.workers = export_workers(opts.workers)  # each map worker exports its reports
        self.parts = RunPaths(run).parts
        self.metas: list[dict[str, Any]] = []
        self.counts: dict[str, Any] = {}

    def read(self, reports: list[ReportFile]) -> tuple[list[Member], list[str]]:
        o, array = self.opts, self.opts.array
        threads = (array.cpus or (array.cluster.slurm.cpus_per_task if array.cluster else None) or 1) if array else 1
        kept = (o.extra_meta or {}).get("job")  # how the job ended: each map cuts where its rank stopped
        ended = JobEvidence.from_store(kept if isinstance(kept, str) else None)
        job = ended.end_only() if ended else None
        tasks = [MapTask(report=r, parts=self.parts.resolve(), exports=exports_dir(self.run).resolve(), nsys=o.nsys,
                         engine=o.engine, keep_env=o.keep_env, threads=threads,
                         summaries=array is not None if o.summaries is None else o.summaries, job=job)
                 for r in reports]
        self.parts.mkdir(parents=True, exist_ok=True)
        metas = {t.rid: read_meta(t.meta) for t in tasks}
        todo = [t for t in tasks if not t.fresh(metas[t.rid])]
        # Temps of killed maps (we hold the lock: none runs). A map writes its rank's meta last, so
        # a killed one leaves its rank to map again: with nothing to map (the parts the job
        # mapped, every collect after the first) there are none, and the parts' folders, one a
        # table and rank, are not listed (thousands, on a shared filesystem, every collect).
        # The reduce reads the files the metas name, never a temp.
        if todo:
            for d in self.parts.glob("table=*/rank=*"):
                clean_stale(d, PART_TMP)
        lost: dict[str, str] = {}
        failed: list[TaskOutcome] = []
        if todo and array is not None:
            # Here, not at the top: submitit, the job spec and its renderer are what a map
            # array needs, and a local collect or `orch analyze` would pay their import.
            from orchestrator.submit.array import run_array

            outcomes = run_array(map_chunk_strict, todo, RunPaths(self.run).submitit_collect, array, self.console,
                                 label=lambda t: t.report.origin)
            failed = [x for x in outcomes if x.state != "COMPLETED"]
            by_origin = {t.report.origin: t for t in todo}
            for x in failed:
                for origin in x.reports:
                    t = by_origin[origin]
                    meta = read_meta(t.meta)
                    if not x.node and meta and meta.get("slurm_task") is not None:
                        x.node = meta.get("host")  # accounting may lag: the node the map ran on
                    lost[t.rid] = _task_error(x)
        elif todo:
            lost = _map_local(todo, self.workers, self.console)
        for t in todo:
            metas[t.rid] = read_meta(t.meta)
        for t in tasks:
            meta = metas[t.rid]
            try:
                current = meta is not None and meta["source"] == source_stamp(t.report.origin)
            except OSError:
                current = False
            if not current:  # never mapped from this very file: the task died first
                meta = _lost_meta(t, lost.get(t.rid, "map produced no result for this report"))
            self.metas.append(meta)
        self.counts = {"mapped": len(todo), "reused": len(tasks) - len(todo), "failed_tasks": failed}
        members, warnings = members_from_metas(self.metas)
        without = [m for m in self.metas if m.get("summary_error")]
        if without:
            warnings.append(f"map statistics: not computed for {len(without)} report(s) (first, "
                            f"{Path(without[0]['report']['origin']).name}: {without[0]['summary_error']}); "
                            "the report computes those ranks itself")
        return members, warnings

    @contextmanager
    def write(self, members: list[Member], store: Path, layout: Layout) -> Iterator[Written]:
        o = self.opts
        with progress.task("reduce"):
            views = build_store_from_parts(
                self.metas, self.parts, store, layout=layout, keep_env=o.keep_env, align=o.align,
                expected=o.expected, extra_meta=o.extra_meta, threads=self.workers, members=members,
                views=[] if o.copy_events else (*VIEWABLE, *IF_MAPPED),
                view_min_rows=VIEW_MIN_ROWS if o.view_min_rows is None else o.view_min_rows)
        yield Written(None, "parts", {**self.counts, "views": views})
