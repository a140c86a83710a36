"""`orch` command line: one subcommand per pipeline stage, thin over the stage modules.

Every user-fixable problem surfaces as `OrchError`: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console

from orchestrator import __version__
from orchestrator.errors import OrchError

console = Console(stderr=False, highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with a one-line message (its default prints usage too)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise OrchError(f"{self.prog}: {message}; see `{self.prog} --help`")


def cmd_validate(a: argparse.Namespace) -> int:
    from orchestrator.render import render
    from orchestrator.spec import load_job
    from orchestrator.spec.ranks import format_ranges

    job = load_job(a.job)
    render(job, Path(a.job).resolve().parent / ".orch-validate")  # renders in memory only
    console.print(
        f"[green]ok[/green] {a.job}: {job.spec.name} on {job.cluster.name} "
        f"({job.cluster.executor}), {job.nodes} node(s) x {job.nproc_per_node} = world {job.world_size}, "
        f"layout tp={job.tp} pp={job.pp} dp={job.dp}, profiled ranks {format_ranges(job.profiled_ranks)}"
        + (f", GPU metrics {job.gpu_metrics_set} on ranks {format_ranges(job.collector_ranks)}"
           if job.gpu_metrics_set else "")
    )
    return 0


def cmd_render(a: argparse.Namespace) -> int:
    from orchestrator.render import render
    from orchestrator.spec import load_job

    job = load_job(a.job)
    out = Path(a.output or f"orch-render-{job.spec.name}")
    rendered = render(job, out / "scripts")
    rendered.write()
    for name in rendered.scripts:
        console.print(f"wrote {rendered.script_dir / name}")
    console.print(f"reports will be written as {rendered.report_pattern}.nsys-rep")
    return 0


def _add_commands(sub: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    handlers: dict[str, Callable[[argparse.Namespace], int]] = {}

    p = sub.add_parser("validate", help="check a job spec and its cluster config")
    p.add_argument("job", help="job.yaml")
    handlers["validate"] = cmd_validate

    p = sub.add_parser("render", help="write sbatch.sh, launch.sh and rank_wrapper.sh")
    p.add_argument("job", help="job.yaml")
    p.add_argument("-o", "--output", help="directory (default ./orch-render-NAME); scripts go in DIR/scripts")
    handlers["render"] = cmd_render

    from orchestrator import commands

    handlers.update(commands.register(sub))
    return handlers


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[[argparse.Namespace], int]]]:
    parser = _Parser(prog="orch", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"orch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    handlers = _add_commands(sub)
    return parser, handlers


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser, handlers = build_parser()
        a = parser.parse_args(argv)
        return handlers[a.command](a)
    except OrchError as e:
        err_console.print(f"orch: error: {e}", markup=False)
        return e.exit_code
    except KeyboardInterrupt:
        return _interrupted()
    except Exception as e:
        # DuckDB turns Ctrl-C during a query into RuntimeError("Query interrupted").
        cause: BaseException | None = e
        while cause is not None and not isinstance(cause, KeyboardInterrupt):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        return _interrupted()


def _interrupted() -> int:
    err_console.print("orch: interrupted; nothing half-written was kept", markup=False)
    return 130


if __name__ == "__main__":
    sys.exit(main())
