"""What every subcommand module shares: the consoles, argument types that reject bad values at
parse time, and output-path checks made before any work starts.

A value or path the user can fix is an `OrchError` (one line, exit 2) raised *before* the
first file is written, so a bad `--json` never costs a 10-minute collect or leaves half a
result behind.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from orchestrator.errors import OrchError

if TYPE_CHECKING:
    from rich.console import Console


class _LazyConsole:
    """A rich Console made on first use. The CLI modules load without rich, pydantic or
    DuckDB (slow imports; docs/benchmarks-code.md), so that `orch collect`/`analyze` start the nsys exports
    first and load the rest while nsys runs (collect/gather.early_exports).

    On first use the object turns into a real `Console` in place (its class set to Console, then
    Console's own __init__ run on it), so from then on it is one everywhere: a proxy would not be,
    as Python looks special methods up on the type (rich's live display does `with console:` only
    when the output is a terminal), and `isinstance` and identity checks would see the proxy."""

    def __init__(self, **options: Any) -> None:
        object.__setattr__(self, "_options", options)

    def _become_console(self) -> Console:
        from rich.console import Console

        opts = dict(self.__dict__.pop("_options"))
        terminal = Console(stderr=opts.get("stderr", False)).is_terminal
        # A person reads a terminal: text wraps at its width, between words. A pipe, a file or
        # a CI log gets each line whole (grep, copy), and tables wide enough for every column.
        opts["soft_wrap"] = not terminal
        if opts.pop("wide_unless_terminal", False) and not terminal:
            opts["width"] = 160
        object.__setattr__(self, "__class__", Console)
        console = cast("Console", self)
        Console.__init__(console, **opts)
        return console

    def __getattr__(self, name: str) -> Any:  # only reached while still lazy
        return getattr(self._become_console(), name)

    def __setattr__(self, name: str, value: Any) -> None:  # e.g. `console.width = 100`
        setattr(self._become_console(), name, value)

    def __enter__(self) -> Console:
        return self._become_console().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._become_console().__exit__(*exc)

    def __repr__(self) -> str:
        return repr(self._become_console())


# Wide enough for the per-rank table when the output goes to a file or a CI log. No emoji
# codes: a trace name `:skull:` is printed as written (markup escaping does not cover them).
out = cast("Console", _LazyConsole(highlight=False, emoji=False, wide_unless_terminal=True))
err = cast("Console", _LazyConsole(stderr=True, highlight=False, emoji=False))
Handler = Callable[[argparse.Namespace], int]
MAX_WORKERS = 64


def positive_float(example: str) -> Callable[[str], float]:
    """argparse type: a finite number > 0 (nan, inf, 0 and negatives are refused)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number > 0; use e.g. {example}")
        return value

    return parse


def positive_int(example: str) -> Callable[[str], int]:
    """argparse type: a whole number > 0."""

    def parse(text: str) -> int:
        t = text.strip().replace("_", "")
        if not (t.isascii() and t.isdigit() and 0 < len(t) <= 12 and int(t) > 0):
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number > 0; use e.g. {example}")
        return int(t)

    return parse


def rank_list(text: str) -> list[int]:
    """argparse type: '0,3,8-15' (the store says later which ranks exist)."""
    from orchestrator.spec.ranks import parse_rank_list

    try:
        return parse_rank_list(text, world=10**9, field="--ranks")
    except OrchError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def workers(text: str) -> int:
    """argparse type for --workers: 1..64 (each worker may run one `nsys export`)."""
    t = text.strip()
    value = int(t) if t.isascii() and t.isdigit() and len(t) <= 6 else 0
    if not 1 <= value <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a worker count from 1 to {MAX_WORKERS}; "
                                         "use e.g. --workers 4 or leave it out")
    return value


def _probe_writable(folder: Path, flag: str, path: Path) -> None:
    """Create and remove a temp file: the only test that holds for root, read-only mounts
    and /proc alike."""
    try:
        fd, name = tempfile.mkstemp(prefix=".orch-probe-", dir=folder)
        os.close(fd)
        os.unlink(name)
    except (OSError, ValueError) as e:
        raise OrchError(f"{flag} {path}: cannot write in {folder} ({getattr(e, 'strerror', None) or e}); "
                        "choose a writable location") from None


def check_output_file(path: str | None, flag: str, created: str | None = None) -> None:
    """An output file: not a directory, its folder exists (or is `created`, the directory
    this command makes first, e.g. analyze's --out) and is writable."""
    if not path:
        return
    p = Path(path)
    if created and not p.parent.exists() and p.parent.absolute() == Path(created).absolute():
        check_output_dir(created, flag)
        return
    if p.is_dir():
        raise OrchError(f"{flag} {path} is a directory; give a file name, e.g. {flag} {p / 'report'}"
                        f"{p.suffix or ('.html' if 'html' in flag else '.json')}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise OrchError(f"{flag} {path}: folder {parent} does not exist; create it first (mkdir -p {parent})")
    if not parent.is_dir():
        raise OrchError(f"{flag} {path}: {parent} is not a folder; fix the path")
    _probe_writable(parent, flag, p)


def check_output_dir(path: str | None, flag: str) -> None:
    """An output directory: if it exists it is a directory; else its nearest existing
    ancestor is a writable directory (it will be created)."""
    if not path:
        return
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OrchError(f"{flag} {path} is a file, not a directory; give a directory (it is created if missing)")
    anc = p if p.exists() else next((a for a in p.absolute().parents if a.exists()), Path("/"))
    if not anc.is_dir():
        raise OrchError(f"{flag} {path}: {anc} is a file, not a directory; fix the path")
    _probe_writable(anc, flag, p)


def run_arg(a: argparse.Namespace) -> Path:
    """The run directory named by a job id or a path (`run` and `--runs` arguments)."""
    from orchestrator.rundir import find_run

    return find_run(a.run, Path(a.runs) if a.runs else None)


def store_of(ref: str, runs: str | None) -> Path:
    """A `profile.duckdb` given directly, the one in a directory (a run's, or the `--out` of
    `orch collect --from`/`orch analyze`), or the one of a run found by job id."""
    from orchestrator.rundir import find_run
    from orchestrator.runpaths import MANIFEST, STORE

    p = Path(ref)
    if p.is_file() and p.suffix == ".duckdb":
        return p
    if (p / STORE).is_file():
        return p / STORE
    if p.is_dir() and not (p / MANIFEST).is_file() and not ref.isdigit():  # a job id is looked up
        raise OrchError(f"{ref} holds no {STORE} and is not an orch run; collect into it first "
                        f"(`orch collect --from REPORTS --out {ref}`) or give a job id")
    return find_run(ref, Path(runs) if runs else None) / STORE


def runs_opt(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs", help="run root to search for job ids (default ./orch-runs or $ORCH_RUNS)")
