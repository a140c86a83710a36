"""`orch collect` and `orch redact`: the collect stage (reports -> one DuckDB store)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from orchestrator import naming
from orchestrator.cli.common import Handler, check_output_dir, err, out, run_arg, runs_opt, workers
from orchestrator.errors import OrchError
from orchestrator.layout import Layout
from orchestrator.rundir import read_manifest


def collect_from_run(run: Path, a: argparse.Namespace) -> Any:
    """Collect the reports a submitted job's manifest expects."""
    from orchestrator.collect.collect import collect

    m = read_manifest(run)
    if not m.profiled_ranks:
        raise OrchError(f"job {m.job_id} profiled no ranks (profile.ranks: none): nothing to collect")
    if not Path(m.report_dir).is_dir():
        raise OrchError(f"no reports from job {m.job_id} in {m.report_dir} (expected ranks "
                        f"{m.profiled_ranks}); see `orch status {m.job_id}`")
    return collect([Path(m.report_dir)], run, layout=m.job_layout(), expected=m.profiled_ranks,
                   name_prefix=naming.name_prefix(m.output_name, m.job_id), nsys=a.nsys or m.nsys,
                   workers=a.workers, keep_env=a.keep_env, engine=a.engine, align=a.align_clocks,
                   console=err, extra_meta={"job_id": m.job_id, "run": str(run)})


def collect_from_paths(paths: list[str], dest: Path, a: argparse.Namespace) -> Any:
    """Collect reports orch did not submit; a partial --layout gets dp from the ranks found."""
    from orchestrator.collect.collect import collect

    return collect([Path(p) for p in paths], dest, layout=Layout.parse(a.layout), nsys=a.nsys,
                   workers=a.workers, keep_env=a.keep_env, engine=a.engine, align=a.align_clocks,
                   console=err)


def print_collect(res: Any) -> None:
    out.print(f"store: {res.store} ({len(res.ok_ranks)} rank(s) ok, engine {res.engine})", markup=False)
    for w in res.warnings:
        err.print(f"warning: {w}", markup=False)
    for m in res.bad:
        reason = m.probe.error or "; ".join(m.notes)
        out.print(f"  {m.report.origin.name}: {m.status if not m.probe.error else 'error'}"
                  f"{f' (rank {m.rank})' if m.rank is not None else ''}: {reason}", markup=False)
    if res.missing:
        out.print(f"missing ranks: {', '.join(map(str, res.missing))}")
    if res.extra:
        out.print(f"extra ranks (not expected): {', '.join(map(str, res.extra))}")


def cmd_collect(a: argparse.Namespace) -> int:
    if a.from_paths:
        Layout.parse(a.layout)  # a bad --layout fails before any work
        check_output_dir(a.out, "--out")
        dest = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="orch-collect-", dir="."))
        res = collect_from_paths(a.from_paths, dest, a)
    else:
        if not a.run:
            raise OrchError("orch collect needs a job id / run directory, or --from PATH...")
        res = collect_from_run(run_arg(a), a)
    print_collect(res)
    return 0


def cmd_redact(a: argparse.Namespace) -> int:
    from orchestrator.collect.redact import redact_export

    check_output_dir(a.output, "-o")
    for f in a.exports:
        out.print(f"wrote {redact_export(Path(f), Path(a.output))}", markup=False)
    return 0


def collect_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=workers, default=None, help="parallel exports/ingests (default: cores, max 8)")
    p.add_argument("--keep-env", action="store_true", help="keep the whole captured environment (secrets!)")
    p.add_argument("--engine", choices=("auto", "scanner", "sqlite3"), default="auto",
                   help="read SQLite with DuckDB's sqlite scanner or Python sqlite3 (fallback)")
    p.add_argument("--align-clocks", action="store_true",
                   help="refine the shared clock by aligning matched NCCL kernel ends across ranks")
    p.add_argument("--nsys", help="nsys binary for `nsys export` (default: the job's, $NSYS, PATH)")
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
