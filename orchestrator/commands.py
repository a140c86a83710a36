"""Subcommands of the later pipeline stages: submit, status, cancel, collect, report, analyze,
diff, export-trace. Each handler parses its arguments and calls one stage module."""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console

from orchestrator import naming
from orchestrator.errors import OrchError
from orchestrator.rundir import STORE, find_run, read_manifest

# Wide enough for the per-rank table when the output goes to a file or a CI log.
out = Console(highlight=False, soft_wrap=True, width=None if Console().is_terminal else 160)
err = Console(stderr=True, highlight=False, soft_wrap=True)
Handler = Callable[[argparse.Namespace], int]


def parse_layout(text: str | None):
    from orchestrator.layout import Layout

    return Layout.parse(text)


def _run_arg(a: argparse.Namespace) -> Path:
    return find_run(a.run, Path(a.runs) if a.runs else None)


# ---------------------------------------------------------------- submit / status / cancel


def cmd_submit(a: argparse.Namespace) -> int:
    from orchestrator.spec import load_job
    from orchestrator.submit.core import submit

    job = load_job(a.job)
    run, m = submit(job, Path(a.runs) if a.runs else None)
    out.print(f"submitted {m['name']} as job {m['job_id']} ({m['executor']}, {m['nodes']} node(s) x "
              f"{m['nproc_per_node']}); run directory {run}")
    if not a.wait:
        out.print(f"next: orch status {m['job_id']}   then: orch collect {m['job_id']}")
        return 0
    return _wait_and_summarize(run, a.timeout)


def _wait_and_summarize(run: Path, timeout: float | None) -> int:
    from orchestrator.submit.core import wait

    last = {"state": None}

    def show(st: dict[str, Any]) -> None:
        found = sum(1 for v in st["reports"].values() if v)
        line = f"job {st['job_id']}: {st['state']} ({found}/{len(st['profiled_ranks'])} reports)"
        if line != last["state"]:
            err.print(line, markup=False)
            last["state"] = line

    st = wait(run, show, timeout_s=timeout)
    _print_status(st)
    return 0 if st["state"] == "COMPLETED" else 1


def _print_status(st: dict[str, Any]) -> None:
    from rich.table import Table

    out.print(f"job {st['job_id']} ({st['name']}, {st['executor']}): [bold]{st['state']}[/bold] "
              f"(from {st['source']})")
    t = Table(title="tasks (one per node)")
    for c in ("task", "result", "error"):
        t.add_column(c)
    for task in st["tasks"]:
        t.add_row(str(task["task"]), task["result"], task.get("error", ""))
    out.print(t)
    for task in st["tasks"]:
        if task.get("log_tail"):
            out.print(f"--- task {task['task']} log tail ({task['stderr']}):", markup=False)
            out.print(task["log_tail"], markup=False)
    for rank in st["profiled_ranks"]:
        files = st["reports"].get(rank) or st["reports"].get(str(rank)) or []
        out.print(f"rank {rank}: " + (", ".join(Path(f).name for f in files) if files else "no report yet"),
                  markup=False)


def cmd_status(a: argparse.Namespace) -> int:
    from orchestrator.submit.core import job_status

    st = job_status(_run_arg(a))
    if a.json:
        out.print_json(json.dumps(st, default=str))
    else:
        _print_status(st)
    return 0


def cmd_cancel(a: argparse.Namespace) -> int:
    from orchestrator.submit.executors import cancel

    run = _run_arg(a)
    m = read_manifest(run)
    cancel(m["executor"], m["job_id"], Path(m["submitit_folder"]))
    out.print(f"cancel requested for job {m['job_id']}")
    return 0


# ---------------------------------------------------------------- collect


def _collect_from_run(run: Path, a: argparse.Namespace):
    from orchestrator.collect.collect import collect
    from orchestrator.collect.identity import Layout

    m = read_manifest(run)
    if not m["profiled_ranks"]:
        raise OrchError(f"job {m['job_id']} profiled no ranks (profile.ranks: none): nothing to collect")
    if not Path(m["report_dir"]).is_dir():
        raise OrchError(f"no reports from job {m['job_id']} in {m['report_dir']} (expected ranks "
                        f"{m['profiled_ranks']}); see `orch status {m['job_id']}`")
    lay = m["layout"]
    layout = Layout(world_size=m["world_size"], nproc_per_node=m["nproc_per_node"], tp=lay["tp"],
                    pp=lay["pp"], dp=lay["dp"], known=lay.get("known", True))
    return collect([Path(m["report_dir"])], run, layout=layout, expected=m["profiled_ranks"],
                   name_prefix=naming.name_prefix(m["output_name"], m["job_id"]), nsys=a.nsys or m.get("nsys"),
                   workers=a.workers, keep_env=a.keep_env, engine=a.engine, align=a.align_clocks,
                   console=err, extra_meta={"job_id": m["job_id"], "run": str(run)})


def _collect_from_paths(paths: list[str], dest: Path, a: argparse.Namespace):
    from orchestrator.collect.collect import collect

    return collect([Path(p) for p in paths], dest, layout=parse_layout(a.layout), nsys=a.nsys,
                   workers=a.workers, keep_env=a.keep_env, engine=a.engine, align=a.align_clocks,
                   console=err)


def _print_collect(res) -> None:
    out.print(f"store: {res.store} ({len(res.ok_ranks)} rank(s) ok, engine {res.engine})")
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
        dest = Path(a.out) if a.out else Path(tempfile.mkdtemp(prefix="orch-collect-", dir="."))
        res = _collect_from_paths(a.from_paths, dest, a)
    else:
        if not a.run:
            raise OrchError("orch collect needs a job id / run directory, or --from PATH...")
        res = _collect_from_run(_run_arg(a), a)
    _print_collect(res)
    return 0


# ---------------------------------------------------------------- report / analyze / diff / trace


def _store_of(ref: str, runs: str | None) -> Path:
    p = Path(ref)
    if p.is_file() and p.suffix == ".duckdb":
        return p
    return find_run(ref, Path(runs) if runs else None) / STORE


def _emit(report: dict[str, Any], a: argparse.Namespace) -> None:
    from orchestrator.fsutil import write_json_atomic, write_text_atomic
    from orchestrator.report.html import render_html
    from orchestrator.report.terminal import print_report

    print_report(report, out)
    if a.json:
        write_json_atomic(Path(a.json), report)
        out.print(f"wrote {a.json}")
    if a.html:
        write_text_atomic(Path(a.html), render_html(report))
        out.print(f"wrote {a.html}")


def _options(a: argparse.Namespace):
    from orchestrator.analyze.engine import Options, parse_steps

    if a.gap_ms <= 0:
        raise OrchError("--gap-ms must be > 0")
    return Options(gap_ms=a.gap_ms, steps=parse_steps(a.steps))


def cmd_report(a: argparse.Namespace) -> int:
    from orchestrator.analyze.report import build_report

    _emit(build_report(_store_of(a.run, a.runs), _options(a)), a)
    return 0


def cmd_analyze(a: argparse.Namespace) -> int:
    from orchestrator.analyze.report import build_report

    opts = _options(a)
    place = contextlib.nullcontext(a.out) if a.out else tempfile.TemporaryDirectory(prefix="orch-analyze-")
    with place as dest:
        res = _collect_from_paths(a.paths, Path(dest), a)
        _print_collect(res)
        _emit(build_report(res.store, opts), a)
    return 0


def _load_report(ref: str, runs: str | None) -> dict[str, Any]:
    from orchestrator.analyze.engine import Options
    from orchestrator.analyze.report import build_report

    p = Path(ref)
    if p.is_file() and p.suffix == ".json":
        try:
            return json.loads(p.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise OrchError(f"{p} is not a report JSON written by `orch report --json`") from None
    return build_report(_store_of(ref, runs), Options())


def cmd_diff(a: argparse.Namespace) -> int:
    from rich.table import Table

    from orchestrator.report.diff import diff_reports

    d = diff_reports(_load_report(a.a, a.runs), _load_report(a.b, a.runs), scale=a.threshold_scale)
    t = Table(title=f"{a.a} -> {a.b}")
    for c in ("rank", "metric", "A", "B", "delta", ""):
        t.add_column(c)
    for r in d["rows"]:
        if r["delta"] or r["regressed"]:
            t.add_row(str(r["rank"]), r["metric"], str(r["a"]), str(r["b"]), f"{r['delta']:+}",
                      "[red]REGRESSED[/red]" if r["regressed"] else "")
    out.print(t)
    if d["only_in_a"] or d["only_in_b"]:
        out.print(f"ranks only in A: {d['only_in_a']}, only in B: {d['only_in_b']}")
    if a.json:
        from orchestrator.fsutil import write_json_atomic

        write_json_atomic(Path(a.json), d)
    out.print(f"{len(d['regressions'])} regression(s)")
    return 1 if d["regressions"] else 0


def cmd_export_trace(a: argparse.Namespace) -> int:
    from orchestrator.report.trace import export_trace

    n = export_trace(_store_of(a.run, a.runs), Path(a.output))
    out.print(f"wrote {a.output} ({n} events); open it in https://ui.perfetto.dev")
    return 0


def cmd_redact(a: argparse.Namespace) -> int:
    from orchestrator.collect.redact import redact_export

    for f in a.exports:
        out.print(f"wrote {redact_export(Path(f), Path(a.output))}")
    return 0


def _report_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", help="write the report as JSON (schema: README, Report)")
    p.add_argument("--html", help="write a self-contained HTML report")
    p.add_argument("--steps", help="A:B: analyze steps A..B (default: all steps after the first)")
    p.add_argument("--gap-ms", type=float, default=1.0, help="smallest GPU idle gap reported (ms)")


def _collect_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=int, default=None, help="parallel exports/ingests (default: cores, max 8)")
    p.add_argument("--keep-env", action="store_true", help="keep the whole captured environment (secrets!)")
    p.add_argument("--engine", choices=("auto", "scanner", "sqlite3"), default="auto",
                   help="read SQLite with DuckDB's sqlite scanner or Python sqlite3 (fallback)")
    p.add_argument("--align-clocks", action="store_true",
                   help="refine the shared clock by aligning matched NCCL kernel ends across ranks")
    p.add_argument("--nsys", help="nsys binary for `nsys export` (default: the job's, $NSYS, PATH)")


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:
    def runs_opt(p: argparse.ArgumentParser) -> None:
        p.add_argument("--runs", help="run root to search for job ids (default ./orch-runs or $ORCH_RUNS)")

    p = sub.add_parser("submit", help="render and submit a job (Slurm or local) through submitit")
    p.add_argument("job")
    p.add_argument("--wait", action="store_true", help="follow the job and print the summary at the end")
    p.add_argument("--timeout", type=float, default=None, help="stop waiting after this many seconds")
    runs_opt(p)
    p = sub.add_parser("status", help="job state per task, profiled ranks, reports written so far")
    p.add_argument("run", help="job id or run directory")
    p.add_argument("--json", action="store_true")
    runs_opt(p)
    p = sub.add_parser("cancel", help="cancel a submitted job")
    p.add_argument("run", help="job id or run directory")
    runs_opt(p)
    p = sub.add_parser("collect", help="gather, export and merge every rank's report into DuckDB")
    p.add_argument("run", nargs="?", help="job id or run directory")
    p.add_argument("--from", dest="from_paths", nargs="+", metavar="PATH",
                   help="reports orch did not submit: files or directories")
    p.add_argument("--out", help="with --from: the directory for the store (default: a new one here)")
    p.add_argument("--layout", help="with --from: tp=..,pp=..,dp=..")
    _collect_opts(p)
    runs_opt(p)
    p = sub.add_parser("report", help="cross-rank comparison report from a collected run")
    p.add_argument("run", help="job id, run directory or profile.duckdb")
    _report_opts(p)
    runs_opt(p)
    p = sub.add_parser("analyze", help="collect reports made elsewhere and report in one step")
    p.add_argument("paths", nargs="+")
    p.add_argument("--layout", help="tp=..,pp=..,dp=..")
    p.add_argument("--out", help="keep the store in this directory (default: a temp one)")
    _report_opts(p)
    _collect_opts(p)
    p = sub.add_parser("diff", help="compare two runs; exit 1 when a metric regresses")
    p.add_argument("a", help="baseline: report JSON, job id, run directory or profile.duckdb")
    p.add_argument("b", help="candidate: same kinds")
    p.add_argument("--threshold-scale", type=float, default=1.0, help="multiply every threshold")
    p.add_argument("--json", help="write the deltas as JSON")
    runs_opt(p)
    p = sub.add_parser("export-trace", help="all ranks as one Chrome/Perfetto JSON timeline")
    p.add_argument("run", help="job id, run directory or profile.duckdb")
    p.add_argument("-o", "--output", required=True)
    runs_opt(p)
    p = sub.add_parser("redact", help="shareable copies of SQLite exports: captured environment removed")
    p.add_argument("exports", nargs="+", help=".sqlite or .sqlite.gz exports")
    p.add_argument("-o", "--output", required=True, help="directory for the redacted .sqlite.gz copies")
    return {"submit": cmd_submit, "status": cmd_status, "cancel": cmd_cancel, "collect": cmd_collect,
            "report": cmd_report, "analyze": cmd_analyze, "diff": cmd_diff,
            "export-trace": cmd_export_trace, "redact": cmd_redact}
