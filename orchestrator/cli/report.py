"""`orch report`, `orch analyze`, `orch diff`, `orch export-trace`: the analyze and report stages.

Every output path is checked before the analysis starts, so a bad `--json` or `--html`
fails in one line with nothing written instead of after minutes of work.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator import progress
from orchestrator.cli.collect import collect_opts, collected_open, early, print_collect, timings_opt
from orchestrator.cli.common import (
    Handler,
    check_output_dir,
    check_output_file,
    err,
    out,
    positive_float,
    positive_int,
    rank_list,
    runs_opt,
    store_of,
)
from orchestrator.errors import OrchError
from orchestrator.report.safe import cell, plain

if TYPE_CHECKING:
    import duckdb

    from orchestrator.analyze.model_report import Report
    from orchestrator.analyze.model_timeline import Extras
    from orchestrator.metrics.engine import Options


def _check_outputs(a: argparse.Namespace, created: str | None = None) -> None:
    check_output_file(a.json, "--json", created)
    check_output_file(a.html, "--html", created)


def _analyse(store: Path, a: argparse.Namespace, opts: Options | None = None,
             writer: duckdb.DuckDBPyConnection | None = None) -> tuple[Report, Extras | None]:
    """The report and, for --html, the timeline's extras from one analysis pass (`writer`: the
    collect's open connection, engine.analysis). What is analysed never depends on the outputs
    asked for: a JSON and an HTML of one run come from the same product; only the HTML draws
    the timeline, whose data is read for it alone."""
    from orchestrator.analyze.build import build_analysis

    return build_analysis(store, opts or _options(a), writer, timeline=bool(a.html))


def _emit(report: Report, extras: Extras | None, a: argparse.Namespace) -> None:
    """Print, then write --json and --html."""
    from orchestrator.fsutil import write_text_atomic
    from orchestrator.report.terminal import print_report
    from orchestrator.timings import phase

    with phase("report: terminal"):
        print_report(report, out, wide=getattr(a, "wide", False))
    if a.json:
        with phase("report: write json"):
            write_text_atomic(Path(a.json), report.model_dump_json(indent=1))
        out.print(f"wrote {plain(a.json)}", markup=False)
    if a.html:
        from orchestrator.report.html import render_html  # (its templates and charts: only for --html)

        with phase("report: write html"), progress.task("HTML report"):
            write_text_atomic(Path(a.html), render_html(report, extras))
        out.print(f"wrote {plain(a.html)}", markup=False)


def _options(a: argparse.Namespace) -> Options:
    from orchestrator.metrics.engine import Options, check_regex, parse_steps

    return Options(gap_ms=a.gap_ms, steps=parse_steps(a.steps), steps_from=check_regex(a.steps_from),
                   microbatches=a.microbatches, tables=a.tables)


def cmd_report(a: argparse.Namespace) -> int:
    _check_outputs(a)
    _emit(*_analyse(store_of(a.run, a.runs), a), a)
    return 0


def _preload(a: argparse.Namespace) -> None:
    """Load the analysis and report modules while the exports `early` started run (their
    imports would otherwise come after the collect)."""
    import orchestrator.analyze.build
    import orchestrator.collect.collect
    import orchestrator.report.terminal

    if a.html:
        import orchestrator.report.html  # noqa: F401


def _collect_and_report(a: argparse.Namespace, dest: Path) -> None:
    """The exports start first; every option is checked (a bad one kills them and keeps
    nothing) while they run. DuckDB's checkpoint, which writes the store while the analysis
    reads it, can fail on its own ("Corrupted in-memory column ... misaligned count": its race,
    under memory pressure); the store is then invalid and nothing was kept, so the collect and
    the analysis run again, the checkpoint first."""
    with early(a, a.paths, dest, a.nsys) as started:
        opts = _options(a)
        _preload(a)
        try:
            with collected_open(a.paths, dest, a, started) as (res, writer):
                print_collect(res)
                report, extras = _analyse(res.store, a, opts, writer)
        except Exception as e:  # (DuckDB is imported once the exports run: not before them)
            from orchestrator.metrics.engine import checkpoint_race

            if not checkpoint_race(e):
                raise
            err.print("orch: DuckDB's checkpoint failed while the analysis read the store (its own race); "
                      "collecting again with the checkpoint first", markup=False)
            with collected_open(a.paths, dest, a, {}, background=False) as (res, writer):
                report, extras = _analyse(res.store, a, opts, writer)
    _emit(report, extras, a)


def cmd_analyze(a: argparse.Namespace) -> int:
    """Collect then report. Without --out the store lives in a temp directory that is
    removed after a good report and KEPT (and named) when the analysis fails."""
    check_output_dir(a.out, "--out")
    _check_outputs(a, created=a.out)
    if a.out:
        _collect_and_report(a, Path(a.out))
        return 0
    dest = Path(tempfile.mkdtemp(prefix="orch-analyze-"))
    try:
        _collect_and_report(a, dest)
    except Exception as e:
        from orchestrator.runpaths import STORE

        store = dest / STORE  # there only once the collect succeeded (written under a temp name)
        if not store.exists():
            shutil.rmtree(dest, ignore_errors=True)  # nothing was collected: nothing to inspect
            raise
        if isinstance(e, OrchError):
            raise OrchError(f"{e}; the collected store is kept in {store} (pass --out DIR to choose "
                            "where; delete it when done)") from None
        err.print(f"orch: the analysis failed; the collected store is kept in {plain(store)}", markup=False)
        raise
    except BaseException:
        shutil.rmtree(dest, ignore_errors=True)  # interrupted: nothing half-done is kept
        raise
    shutil.rmtree(dest, ignore_errors=True)
    return 0


def _load_report(ref: str, runs: str | None) -> Report:
    from orchestrator.analyze.build import build_report
    from orchestrator.analyze.model_report import load_report
    from orchestrator.metrics.engine import Options

    p = Path(ref)
    if p.is_file() and p.suffix == ".json":
        not_report = f"{p} is not a report JSON written by `orch report --json`; give one, or a run/store"
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            raise OrchError(not_report) from None
        if not isinstance(data, dict) or not {"schema_version", "ranks"} <= set(data) \
                or not isinstance(data["ranks"], list):
            raise OrchError(not_report + " (it lacks schema_version/ranks)")
        return load_report(p)  # the typed model: a field that is off is named in one line
    return build_report(store_of(ref, runs), Options())


def cmd_diff(a: argparse.Namespace) -> int:
    from rich.table import Table

    from orchestrator.report.diff import diff_reports, pace_line
    from orchestrator.report.findings_diff import findings_lines

    check_output_file(a.json, "--json")
    d = diff_reports(_load_report(a.a, a.runs), _load_report(a.b, a.runs), scale=a.threshold_scale)
    t = Table(title=cell(f"{a.a} -> {a.b}"))
    for c in ("rank", "metric", "A", "B", "delta", ""):
        t.add_column(c)
    for r in d["rows"]:
        if r["delta"] or r["regressed"]:
            mark = "[red]REGRESSED[/red]" if r["regressed"] else "B faster" if r.get("faster") else ""
            t.add_row(str(r["rank"]), cell(r["metric"]), str(r["a"]), str(r["b"]), f"{r['delta']:+}", mark)
    out.print(t)
    if d["only_in_a"] or d["only_in_b"]:
        out.print(f"ranks only in A: {d['only_in_a']}, only in B: {d['only_in_b']}", markup=False)
    for line in [*d["replay"], pace_line(d), *findings_lines(d["findings"])]:
        if line:
            out.print(line, markup=False)
    if a.json:
        from orchestrator.fsutil import write_json_atomic

        write_json_atomic(Path(a.json), d)
    out.print(f"{len(d['regressions'])} regression(s)")
    return 1 if d["regressions"] else 0


def cmd_export_trace(a: argparse.Namespace) -> int:
    from orchestrator.export.trace import export_trace, trace_format

    check_output_file(a.output, "-o")
    trace_format(Path(a.output))
    store = store_of(a.run, a.runs)

    def priority() -> list[int]:
        """The ranks the report blames and their victims, the median rank, rank 0."""
        from orchestrator.analyze.build import build_report
        from orchestrator.analyze.rank_pick import trace_order
        from orchestrator.metrics.engine import Options

        return trace_order(build_report(store, Options()))

    res = export_trace(store, Path(a.output), ranks=a.ranks, max_events=a.max_events, priority=priority)
    out.print(f"wrote {plain(a.output)} ({res.events} events, {len(res.ranks)} ranks); "
              "open it in https://ui.perfetto.dev", markup=False)
    if res.note:
        err.print(f"note: {res.note}", markup=False)
    return 0


def report_opts(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", help="write the report as JSON (schema: docs/report.schema.json)")
    p.add_argument("--html", help="write a self-contained HTML report")
    p.add_argument("--steps", help="A:B: analyze steps A..B (default: all steps after the first)")
    p.add_argument("--gap-ms", type=positive_float("--gap-ms 1"), default=1.0,
                   help="smallest GPU idle gap reported (ms)")
    p.add_argument("--steps-from", metavar="REGEX",
                   help="NVTX ranges whose name matches REGEX are the steps (default: detected)")
    p.add_argument("--microbatches", type=int, help="pipeline microbatches per step (for the bubble's theory)")
    p.add_argument("--tables", choices=("phases", "all"), default="phases",
                   help="nsys-stats tables in the terminal: phases (default) or all (kernels, memory ops, "
                        "CUDA API/OS runtime, threads); JSON and HTML always carry all")
    p.add_argument("--wide", action="store_true", help="terminal: every column and every rank (default: 100 columns)")


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:
    p = sub.add_parser("report", help="cross-rank comparison report from a collected run")
    p.add_argument("run", help="job id, run directory, the --out of a collect, or profile.duckdb")
    report_opts(p)
    runs_opt(p)
    timings_opt(p)
    p = sub.add_parser("analyze", help="collect reports made elsewhere and report in one step")
    p.add_argument("paths", nargs="+")
    p.add_argument("--layout", help="tp=..,pp=..,dp=.. (dp may be left out: inferred from the ranks)")
    p.add_argument("--out", help="keep the store in this directory (default: a temp one)")
    report_opts(p)
    collect_opts(p)
    p = sub.add_parser("diff", help="compare two runs; exit 1 when a metric regresses")
    p.add_argument("a", help="baseline: report JSON, job id, run or --out directory, or profile.duckdb")
    p.add_argument("b", help="candidate: same kinds")
    p.add_argument("--threshold-scale", type=positive_float("--threshold-scale 1.5"), default=1.0,
                   help="multiply every threshold")
    p.add_argument("--json", help="write the deltas as JSON")
    runs_opt(p)
    p = sub.add_parser("export-trace", help="all ranks as one timeline: Perfetto protobuf (.pftrace) or Chrome JSON")
    p.add_argument("run", help="job id, run directory, the --out of a collect, or profile.duckdb")
    p.add_argument("-o", "--output", required=True,
                   help="trace.pftrace (Perfetto's own format, any size) or trace.json (Chrome JSON, < ~1 GB)")
    p.add_argument("--ranks", type=rank_list, help="only these ranks, e.g. 0,3,8-15 (default: all that fit)")
    p.add_argument("--max-events", type=positive_int("--max-events 1000000"),
                   help="past this many slices keep the ranks the findings name, their victims, the median "
                        "rank and rank 0 first (default: 20M for .pftrace, 5M for .json)")
    runs_opt(p)
    return {"report": cmd_report, "analyze": cmd_analyze, "diff": cmd_diff, "export-trace": cmd_export_trace}
