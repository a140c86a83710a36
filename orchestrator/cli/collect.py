"""`orch collect` and `orch redact`: the collect stage (reports -> one DuckDB store)."""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.cli.common import Handler, check_output_dir, err, out, run_arg, runs_opt, workers
from orchestrator.errors import OrchError
from orchestrator.report.safe import plain

if TYPE_CHECKING:
    from orchestrator.collect.gather import Started
    from orchestrator.collect.options import CollectOptions

# Imports of pydantic, DuckDB and rich wait inside the functions: the exports start first
# (`early`), and these modules load while nsys runs.


def _map_reduce(a: argparse.Namespace) -> bool:
    """--parts or --on-cluster: the map/reduce collect, which exports in its own workers and
    builds the store in its own connection (`orch analyze` has neither option)."""
    return bool(getattr(a, "parts", False) or getattr(a, "on_cluster", False))


def early(a: argparse.Namespace, paths: list[str], run: Path,
          nsys: str | None = None) -> AbstractContextManager[dict[Path, Started]]:
    """The in-process collect's first exports, started now (gather.early_exports); the
    map/reduce collect (--parts, --on-cluster) exports in its own workers."""
    if _map_reduce(a):
        return nullcontext({})
    from orchestrator.collect.gather import early_exports

    return early_exports([Path(p) for p in paths], run, nsys=nsys, workers=a.workers)


def options(a: argparse.Namespace, **more: Any) -> CollectOptions:
    """The collect's settings from the command line; `more` adds the caller's own."""
    from orchestrator.collect.options import CollectOptions
    from orchestrator.layout import Layout

    array = None
    if getattr(a, "map_stats", None) is not None and not _map_reduce(a):
        flag = "--map-stats" if a.map_stats else "--no-map-stats"
        raise OrchError(f"{flag} is for the map/reduce collect: add --parts (a local pool) or --on-cluster")
    if getattr(a, "on_cluster", False):
        from orchestrator.spec.load import find_cluster, load_cluster
        from orchestrator.submit.array import ArrayOptions

        config = load_cluster(find_cluster(a.cluster, None)) if a.cluster else None
        if config is None and getattr(a, "from_paths", None):
            raise OrchError("--on-cluster with --from needs --cluster NAME (the cluster config to submit the map to)")
        array = ArrayOptions(cluster=config, time=a.time, cpus=a.task_cpus, chunk=a.chunk, timeout_s=a.timeout)
    return CollectOptions(layout=Layout.parse(getattr(a, "layout", None)), nsys=a.nsys, workers=a.workers,
                          keep_env=a.keep_env, engine=a.engine, align=a.align_clocks, console=err,
                          parts=bool(getattr(a, "parts", False)), array=array,
                          summaries=getattr(a, "map_stats", None),
                          copy_events=bool(getattr(a, "copy_events", False)), **more)


@contextmanager
def collected_open(paths: list[str], dest: Path, a: argparse.Namespace,
                   started: dict[Path, Started], background: bool = True) -> Iterator[tuple[Any, Any]]:
    """The collect of `orch analyze`: the in-process collect holds the store open for an
    analysis on its own connection while the checkpoint runs (collect.collecting; `background`
    False: the checkpoint first); the map/reduce collect gives a closed store (connection None)."""
    from orchestrator.collect.collect import collecting

    opts = options(a, started=started, background=background and not _map_reduce(a))
    with collecting([Path(p) for p in paths], dest, opts) as held:
        yield held


def print_collect(res: Any) -> None:
    out.print(f"store: {plain(res.store)} ({len(res.ok_ranks)} rank(s) ok, engine {res.engine})", markup=False)
    if res.engine == "parts":
        out.print(f"parts: {plain(res.store.parent / 'parts')} ({res.mapped} report(s) mapped, {res.reused} reused)"
                  + ("; the store reads its events from them" if res.views else ""), markup=False)
    for t in res.failed_tasks:
        names = plain(", ".join(p.name for p in t.reports))
        out.print(f"map task {t.job_id} {t.state}{f' on {t.node}' if t.node else ''}: {names}", markup=False)
        if t.error:
            out.print(f"  error: {plain(t.error)}", markup=False)
        if t.log_tail:
            for ln in ["  log tail:"] + [f"    {plain(x)}" for x in t.log_tail.splitlines()[-8:]]:
                out.print(ln, markup=False)
    for w in res.warnings:
        err.print(f"warning: {plain(w)}", markup=False)
    for m in res.bad:
        reason = m.probe.error or "; ".join(m.notes)
        out.print(f"  {plain(m.report.origin.name)}: {m.status if not m.probe.error else 'error'}"
                  f"{f' (rank {m.rank})' if m.rank is not None else ''}: {plain(reason)}", markup=False)
    if res.missing:
        out.print(f"missing ranks: {', '.join(map(str, res.missing))}")
    if res.extra:
        out.print(f"extra ranks (not expected): {', '.join(map(str, res.extra))}")


def cmd_collect(a: argparse.Namespace) -> int:
    if a.from_paths:
        check_output_dir(a.out, "--out")
        dest = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="orch-collect-", dir="."))
        try:
            with early(a, a.from_paths, dest, a.nsys) as started:
                from orchestrator.collect.collect import collect

                res = collect([Path(p) for p in a.from_paths], dest, options(a, started=started))
        except BaseException:
            if not a.out:
                _remove_if_empty(dest)  # a bad --layout or path leaves no empty folder behind
            raise
    else:
        if not a.run:
            raise OrchError("orch collect needs a job id / run directory, or --from PATH...")
        from orchestrator.collect.run import collect_run

        res = collect_run(run_arg(a), options(a))
    print_collect(res)
    return 0


def _remove_if_empty(folder: Path) -> None:
    with suppress(OSError):
        folder.rmdir()


def cmd_redact(a: argparse.Namespace) -> int:
    from orchestrator.collect.redact import redact_export

    check_output_dir(a.output, "-o")
    for f in a.exports:
        out.print(f"wrote {plain(redact_export(Path(f), Path(a.output)))}", markup=False)
    return 0


def _count(text: str) -> int:
    t = text.strip()
    if not (t.isascii() and t.isdigit() and 0 < len(t) <= 6 and int(t) > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive count; use e.g. --chunk 8")
    return int(t)


def collect_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=workers, default=None, help="parallel exports/ingests (default: cores, max 8)")
    p.add_argument("--keep-env", action="store_true", help="keep the whole captured environment (secrets!)")
    p.add_argument("--engine", choices=("auto", "scanner", "sqlite3"), default="auto",
                   help="read SQLite with DuckDB's sqlite scanner or Python sqlite3 (fallback)")
    p.add_argument("--align-clocks", action="store_true",
                   help="refine the shared clock by aligning matched NCCL kernel ends across ranks")
    p.add_argument("--nsys", help="nsys binary for `nsys export` (default: the job's, $NSYS, PATH)")
    g = p.add_argument_group("map/reduce over Parquet parts (docs/scale.md)")
    g.add_argument("--parts", action="store_true",
                   help="map every report to Parquet parts in a local process pool, then reduce them into "
                        "the store (incremental: fresh parts are reused)")
    g.add_argument("--copy-events", action="store_true",
                   help="copy the event tables into the store, which can then be moved or shared without its "
                        "run's parts/ (default: it reads the large ones from parts/, so the collect after a job "
                        "costs ranks, not events)")
    g.add_argument("--on-cluster", action="store_true",
                   help="map as one Slurm job array (submitit) with the job's cluster config (implies --parts)")
    g.add_argument("--cluster", help="with --on-cluster: the cluster config (name or path); default the job's")
    g.add_argument("--time", help="with --on-cluster: Slurm time limit per array task (default the cluster's)")
    g.add_argument("--task-cpus", type=workers, help="with --on-cluster: CPUs per array task")
    g.add_argument("--chunk", type=_count, help="with --on-cluster: reports per array task "
                   "(default: enough for at most 1000 tasks)")
    g.add_argument("--timeout", type=float, help="with --on-cluster: stop waiting for the array after this many s")
    g.add_argument("--map-stats", action=argparse.BooleanOptionalAction, default=None,
                   help="with --parts or --on-cluster: each map also computes its rank's phase, API/OS-runtime, "
                        "thread and nsys-rule tables, so that the report need not read every event (default: "
                        "with --on-cluster only; statistics already in reused parts are kept either way)")
    timings_opt(p)


def timings_opt(p: argparse.ArgumentParser) -> None:
    p.add_argument("--timings", action="store_true",
                   help="print the wall time of each phase (export, probe, ingest per table, analysis SQL) to stderr")


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:
    p = sub.add_parser("collect", help="gather, export and merge every rank's report into DuckDB")
    p.add_argument("run", nargs="?", help="job id or run directory")
    p.add_argument("--from", dest="from_paths", nargs="+", metavar="PATH",
                   help="reports orch did not submit: files or directories")
    p.add_argument("--out", help="with --from: the directory for the store (default: a new one here)")
    p.add_argument("--layout", help="with --from: tp=..,pp=..,dp=.. (dp may be left out: inferred from the ranks)")
    collect_opts(p)
    runs_opt(p)
    p = sub.add_parser("redact", help="shareable copies of SQLite exports: captured environment removed")
    p.add_argument("exports", nargs="+", help=".sqlite or .sqlite.gz exports")
    p.add_argument("-o", "--output", required=True, help="directory for the redacted .sqlite.gz copies")
    return {"collect": cmd_collect, "redact": cmd_redact}
