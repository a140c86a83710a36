"""`orch` command line: one subcommand per pipeline stage, thin over the stage modules.

One module per stage: `spec` (validate, render), `submit` (submit, status, cancel),
`collect` (collect, redact), `report` (report, analyze, diff, export-trace), `sweep`. Every
user-fixable problem surfaces as `OrchError`: one line on stderr, exit status 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from orchestrator import __version__, progress
from orchestrator.cli.common import Handler, err
from orchestrator.duckdb_memory import cores, memory_limit, out_of_memory
from orchestrator.errors import OrchError
from orchestrator.report.safe import plain

__all__ = ["build_parser", "main"]


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with a one-line message (its default prints usage too)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise OrchError(f"{self.prog}: {message}; see `{self.prog} --help`")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, Handler]]:
    from orchestrator.cli import collect, report, spec, submit, sweep

    parser = _Parser(prog="orch", description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--version", action="version", version=f"orch {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    handlers: dict[str, Handler] = {}
    for module in (spec, submit, collect, report, sweep):  # the order `orch --help` lists them in
        handlers.update(module.register(sub))
    return parser, handlers


def main(argv: Sequence[str] | None = None) -> int:
    a: argparse.Namespace | None = None
    try:
        parser, handlers = build_parser()
        a = parser.parse_args(argv)
        memory_limit()  # a bad ORCH_DUCKDB_MEMORY fails here, before any work
        cores()  # and a bad ORCH_DUCKDB_THREADS
        progress.show_on(err)  # long work shows its progress where a person looks: a terminal
        return _run(handlers[a.command], a)
    except OrchError as e:
        err.print(f"orch: error: {plain(e)}", markup=False)  # paths and trace names are data
        return e.exit_code
    except KeyboardInterrupt:
        return _interrupted()
    except Exception as e:
        oom = out_of_memory(e, f"orch {a.command}" if a is not None else "orch")
        if oom is not None:  # any command: a store larger than the memory cap allows
            err.print(f"orch: error: {plain(oom)}", markup=False)
            return oom.exit_code
        # DuckDB turns Ctrl-C during a query into RuntimeError("Query interrupted").
        cause: BaseException | None = e
        while cause is not None and not isinstance(cause, KeyboardInterrupt):
            cause = cause.__cause__ or cause.__context__
        if cause is None:
            raise
        return _interrupted()


def _run(handler: Handler, a: argparse.Namespace) -> int:
    """Run one subcommand; with --timings, its per-phase wall times go to stderr at the end."""
    if not getattr(a, "timings", False):
        return handler(a)
    from orchestrator.timings import TIMINGS

    TIMINGS.reset(True)
    try:
        return handler(a)
    finally:
        err.print("\n".join(["timings:", *TIMINGS.lines()]), markup=False)


def _interrupted() -> int:
    err.print("orch: interrupted; nothing half-written was kept", markup=False)
    return 130

