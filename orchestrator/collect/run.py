"""`collect_run`: collect the reports a submitted job's manifest expects, the one entry that
`orch collect JOB` and `orch sweep` share. The job's end (scheduler state, stack and Flight
Recorder dumps; submit/evidence.py) is read now and kept in the store's meta (key `job`),
so a store copied away from its run directory still knows how its job ended.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from orchestrator import naming
from orchestrator.collect.gather import early_exports
from orchestrator.collect.options import CollectOptions
from orchestrator.collect.pipeline import CollectResult
from orchestrator.errors import OrchError
from orchestrator.rundir import read_manifest
from orchestrator.runpaths import RunPaths
from orchestrator.submit.evidence import gather


def run_options(run: Path, opts: CollectOptions) -> tuple[Path, CollectOptions]:
    """The job's reports folder and `opts` completed from its manifest: its layout, ranks,
    report names, nsys, cluster config (for an array without one) and the meta keys."""
    m = read_manifest(run)
    if not m.profiled_ranks:
        raise OrchError(f"job {m.job_id} profiled no ranks (profile.ranks: none): nothing to collect")
    reports = _reports(run, Path(m.report_dir))
    if reports is None:
        raise OrchError(f"no reports from job {m.job_id} in {m.report_dir} (expected ranks "
                        f"{m.profiled_ranks}); see `orch status {m.job_id}`")
    array = opts.array
    if array is not None and array.cluster is None:
        from orchestrator.spec.model import ClusterConfig

        if not m.cluster_config:
            raise OrchError(f"job {m.job_id} has no cluster config to submit the map to: pass --cluster NAME")

        array = replace(array, cluster=ClusterConfig.model_validate(m.cluster_config))
    ev = gather(run)
    meta = {"job_id": m.job_id, "run": str(run), **({"job": ev.model_dump_json()} if ev else {}),
            **(opts.extra_meta or {})}
    return reports, replace(
        opts, layout=m.job_layout(), expected=m.profiled_ranks, name_prefix=naming.name_prefix(m.output_name, m.job_id),
        nsys=opts.nsys or m.nsys or m.cluster_config.get("nsys", {}).get("path"), array=array, extra_meta=meta)


def _reports(run: Path, recorded: Path) -> Path | None:
    """Where the job's reports are now: where the manifest says, else the run's own reports/
    (a run directory moved or copied whole); and where no .nsys-rep is left (deleted to save
    space, not copied), the exports the job or an earlier collect made of them."""
    paths = RunPaths(run)
    for folder in (recorded, paths.reports):
        if folder.is_dir() and any(folder.glob("*.nsys-rep")):
            return folder
    if any(paths.exports.glob("*.sqlite")):
        return paths.exports
    return next((f for f in (recorded, paths.reports) if f.is_dir()), None)


def mapped_in_job(run: Path) -> bool:
    """Whether the job mapped any of its reports itself (profile.map_in_job)."""
    for meta in sorted(RunPaths(run).parts.glob("reports/*.json")):
        try:
            if json.loads(meta.read_text()).get("in_job"):
                return True
        except (OSError, ValueError):
            continue
    return False


def collect_run(run: Path, opts: CollectOptions) -> CollectResult:
    """Collect the run's reports into its store. A run whose job mapped its reports takes the
    parts route: the reduce of what the job mapped, a local map of the rest (without statistics,
    which the analysis computes). The in-process route's first exports start before the store's
    modules (DuckDB, rich) load, so that nsys runs meanwhile."""
    reports, o = run_options(run, opts)
    if not o.map_reduce and mapped_in_job(run):
        o = replace(o, parts=True)
    if o.map_reduce:
        from orchestrator.collect.collect import collect

        return collect([reports], run, o)
    with early_exports([reports], run, nsys=o.nsys, workers=o.workers, name_prefix=o.name_prefix) as started:
        from orchestrator.collect.collect import collect

        return collect([reports], run, replace(o, started=started))
