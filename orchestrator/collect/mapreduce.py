"""`orch collect --parts` / `--on-cluster`: map every report to Parquet parts (a local
process pool, or one Slurm job array), then reduce the parts into the store.

Incremental: a report whose parts are fresh (made from this very file, see parts.is_fresh)
is not mapped again, so a re-run after a failure maps only what is missing or was replaced.
A report whose map did not finish (its task died) gets an error naming the task, its state
and its log's last line; every other rank is still collected.
"""

from __future__ import annotations

import multiprocessing as mp
import re
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from rich.console import Console

from orchestrator.collect.cluster import ArrayOptions, TaskOutcome, run_array
from orchestrator.collect.collect import CollectResult, _complete_layout, _progress, run_lock
from orchestrator.collect.decompress import clean_stale
from orchestrator.collect.gather import discover, export_workers, exports_dir
from orchestrator.collect.mapper import MapTask, map_chunk
from orchestrator.collect.parts import PARTS, probe_to_json, read_meta, report_to_json, source_stamp
from orchestrator.collect.probe import Probe
from orchestrator.collect.reduce import build_store_from_parts, members_from_metas
from orchestrator.errors import OrchError
from orchestrator.layout import Layout
from orchestrator.rundir import STORE

_PART_TMP = re.compile(r"\..*\.tmp-(?P<pid>[0-9]+)\.parquet")


def _map_local(todo: list[MapTask], workers: int, console: Console) -> dict[str, str]:
    """Map in a pool of `workers` processes (spawned: DuckDB must not be forked); returns
    report id -> error for reports whose worker died."""
    lost: dict[str, str] = {}
    if not todo:
        return lost
    with _progress(console) as prog:
        bar = prog.add_task("map", total=len(todo))
        with ProcessPoolExecutor(max_workers=max(1, min(workers, len(todo))),
                                 mp_context=mp.get_context("spawn")) as pool:
            futs = {pool.submit(map_chunk, [t]): t for t in todo}
            for f in as_completed(futs):
                try:
                    f.result()
                except Exception as e:  # a worker killed (OOM) or an unexpected bug: that report only
                    lost[futs[f].rid] = f"map worker failed: {type(e).__name__}: {str(e)[:200]}"
                prog.advance(bar)
    return lost


def _lost_meta(t: MapTask, why: str) -> dict[str, Any]:
    """A report whose map never finished: an error rank, never a silent gap."""
    return {"id": t.rid, "report": report_to_json(t.report), "notes": [], "error": None, "files": {},
            "probe": probe_to_json(Probe(path=t.report.origin, error=why), False)}


def _task_error(o: TaskOutcome) -> str:
    last = o.error or (o.log_tail.strip().splitlines() or ["no log"])[-1]
    return f"map task {o.job_id} {o.state}{f' on {o.node}' if o.node else ''}: {last[:200]}"


def collect_parts(
    paths: list[Path], run: Path, *, layout: Layout, expected: list[int] | None = None,
    name_prefix: str | None = None, nsys: str | None = None, workers: int | None = None,
    keep_env: bool = False, engine: str = "auto", align: bool = False, console: Console | None = None,
    extra_meta: dict[str, object] | None = None, array: ArrayOptions | None = None,
) -> CollectResult:
    """The map/reduce collect; `array` set: the map runs as a Slurm job array."""
    console = console or Console(stderr=True)
    workers = export_workers(workers)  # each map worker exports its reports
    parts = run / PARTS
    with run_lock(run):
        reports = discover(paths, name_prefix)
        if not reports:
            where = ", ".join(str(p) for p in paths)
            raise OrchError(f"no reports (.nsys-rep, .sqlite, .sqlite.gz) found in {where}; "
                            "check the path or wait for the job to finish writing them")
        threads = (array.cpus or array.cluster.slurm.cpus_per_task or 1) if array else 1
        tasks = [MapTask(report=r, parts=parts.resolve(), exports=exports_dir(run).resolve(), nsys=nsys,
                         engine=engine, keep_env=keep_env, threads=threads) for r in reports]
        parts.mkdir(parents=True, exist_ok=True)
        for d in parts.glob("table=*/rank=*"):  # temps of killed maps (we hold the lock: none runs)
            clean_stale(d, _PART_TMP)
        todo = [t for t in tasks if not t.fresh()]
        lost: dict[str, str] = {}
        failed: list[TaskOutcome] = []
        if todo and array is not None:
            outcomes = run_array(todo, run / "submitit-collect", array, console)
            failed = [o for o in outcomes if o.state != "COMPLETED"]
            by_origin = {t.report.origin: t for t in todo}
            for o in failed:
                for origin in o.reports:
                    t = by_origin[origin]
                    meta = read_meta(t.meta)
                    if not o.node and meta and meta.get("slurm_task") is not None:
                        o.node = meta.get("host")  # accounting may lag: the node the map ran on
                    lost[t.rid] = _task_error(o)
        elif todo:
            lost = _map_local(todo, workers, console)
        metas = []
        for t in tasks:
            meta = read_meta(t.meta)
            try:
                current = meta is not None and meta["source"] == source_stamp(t.report.origin)
            except OSError:
                current = False
            if not current:  # never mapped from this very file: the task died first
                meta = _lost_meta(t, lost.get(t.rid, "map produced no result for this report"))
            metas.append(meta)
        members, warnings = members_from_metas(metas)
        layout = _complete_layout(layout, members, warnings)
        if layout.world_size:
            for m in members:
                if m.rank is not None and m.rank >= layout.world_size:
                    m.notes.append(f"rank {m.rank} is outside the world size {layout.world_size}")
        with _progress(console) as prog:
            prog.add_task("reduce", total=None)
            used = build_store_from_parts(metas, parts, run / STORE, layout=layout, keep_env=keep_env,
                                          align=align, expected=expected, extra_meta=extra_meta,
                                          threads=workers, members=members)
    exp = set(expected or [])
    ok = {m.rank for m in members if m.rank is not None and not m.probe.error and m.status == "ok"}
    ranks = [m.rank for m in members if m.rank is not None]
    return CollectResult(
        store=run / STORE, engine=used, members=members, warnings=warnings,
        missing=sorted(exp - ok) if expected is not None else [],
        extra=sorted(set(ranks) - exp) if expected is not None else [],
        mapped=len(todo), reused=len(tasks) - len(todo), failed_tasks=failed,
    )
