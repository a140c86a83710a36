"""Progress of long work a person waits for, shown only where a person looks: a terminal.

The stages (collect's exports and maps, the analysis's SQL, the HTML report, a sweep's runs)
say what they are doing through `task(...)`, which does nothing until the command line calls
`show_on(console)`; then each task is a line of a transient rich display, drawn while it runs
and erased when it ends. Stages never import rich for this (the module loads in microseconds),
and a pipe, a file or a CI log never gets a progress line: rich's display is off there.

Only one rich live display can run at a time: a task started while another is shown is added
to that display as a second line, not drawn twice.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress

_lock = threading.Lock()
_console: Console | None = None
_shown: Progress | None = None
_users = 0


def show_on(console: Console | None) -> None:
    """Draw tasks on `console` (when it is a terminal); None turns the display off."""
    global _console
    _console = console


# Up to this many nodes are named one by one on a task's line; past it, the nodes done are counted.
NODES_NAMED = 4


class Task:
    """One line of the display: `advance()` as parts finish (from any thread), `update()` to
    set the count or reword the line. Without a display, both do nothing. A task over the
    ranks of several nodes says how far each node is: `export (node1 2/4, node2 1/4)`."""

    def __init__(self, prog: Progress | None = None, tid: int = 0, what: str = "",
                 nodes: Sequence[str | None] = ()) -> None:
        self._prog, self._tid, self._what = prog, tid, what
        self._of = Counter(n or "?" for n in nodes)
        self._done: Counter[str] = Counter()

    def advance(self, n: int = 1, node: str | None = None) -> None:
        self._done[node or "?"] += n
        if self._prog is not None:
            self._prog.advance(self._tid, n)  # type: ignore[arg-type]
            if len(self._of) > 1:
                self._prog.update(self._tid, description=self.line())  # type: ignore[arg-type]

    def line(self) -> str:
        """The task's words, with each node's parts done of its own where there are several."""
        if len(self._of) < 2:
            return self._what
        if len(self._of) > NODES_NAMED:
            whole = sum(self._done[k] >= n for k, n in self._of.items())
            return f"{self._what} ({whole} of {len(self._of)} nodes done)"
        return f"{self._what} (" + ", ".join(f"{k} {self._done[k]}/{n}" for k, n in sorted(self._of.items())) + ")"

    def update(self, *, completed: int | None = None, description: str | None = None) -> None:
        if self._prog is not None:
            self._prog.update(self._tid, completed=completed, description=description)  # type: ignore[arg-type]


@contextmanager
def task(what: str, total: int | None = None, nodes: Sequence[str | None] = ()) -> Iterator[Task]:
    """A unit of long work: `what` it is and how many parts it has (None: unknown); `nodes`, the
    node of each part where they are the ranks of a job (`advance(node=...)` counts them)."""
    prog = _enter()
    if prog is None:
        yield Task()
        return
    shown = Task(prog, 0, what, nodes)
    shown._tid = tid = prog.add_task(shown.line(), total=total)
    try:
        yield shown
    finally:
        prog.remove_task(tid)
        _leave()


def _enter() -> Progress | None:
    global _shown, _users
    console = _console
    if console is None or not console.is_terminal:
        return None
    with _lock:
        if _shown is None:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            _shown = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                              TimeElapsedColumn(), console=console, transient=True)
            _shown.start()
        _users += 1
        return _shown


def _leave() -> None:
    global _shown, _users
    with _lock:
        _users -= 1
        if _users == 0 and _shown is not None:
            _shown.stop()
            _shown = None
