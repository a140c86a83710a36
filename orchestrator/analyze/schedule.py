"""Run the analysis SQL files concurrently where they do not depend on each other.

Most of the analysis statements are small and latency-bound: on two ranks DuckDB keeps about
one core busy however many it has, and a report waited for every file one after the other. The
files form a DAG (after `30_intervals.sql` the collectives, gaps, host syncs, phases and
API tables branch apart): on a 2-rank real store the longest chain is 0.25 s of 0.59 s.

The DAG comes from the SQL itself, never from a hand-kept list that could go stale: a file
depends on every earlier file that creates or writes (INSERT/DELETE/UPDATE) a name it
mentions, and on every earlier file that mentions a name it writes (the reader must finish
first). Mentions of a view or macro count as mentions of everything its defining file
mentions, so a view over a table from a third file waits for that file as well. Mentions are
whole words of the SQL without its comments: a spurious match only costs parallelism.

Each worker runs on its own cursor of the one database (DuckDB releases the GIL while it
executes); tables are shared through the in-memory catalog (not TEMP: temp objects are
per connection). A failed file (or Ctrl-C) cancels the files not started and interrupts the
running ones, and the first error is raised; workers take files in file order, so every file
a worker waits for is already running or done (no deadlock).
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import duckdb

from orchestrator.collect.timings import phase

_COMMENT = re.compile(r"--[^\n]*")
_CREATE = re.compile(r"\bCREATE\s+(?:OR\s+REPLACE\s+)?(?:TEMP(?:ORARY)?\s+)?(TABLE|VIEW|MACRO)\s+"
                     r"(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE)
_WRITE = re.compile(r"\b(?:INSERT\s+INTO|DELETE\s+FROM|UPDATE)\s+(\w+)", re.IGNORECASE)
_WORD = re.compile(r"\w+")


@dataclass(frozen=True)
class Unit:
    """One SQL file: its name, its text and the earlier units it must wait for."""

    name: str
    sql: str
    after: tuple[str, ...]


def plan(files: Sequence[tuple[str, str]]) -> list[Unit]:
    """(name, sql) in execution order -> units with their dependencies (see module docstring)."""
    parsed = []
    for name, sql in files:
        text = _COMMENT.sub("", sql)
        made = _CREATE.findall(text)
        writes = {n.lower() for _, n in made} | {n.lower() for n in _WRITE.findall(text)}
        lazy = {n.lower() for kind, n in made if kind.upper() in ("VIEW", "MACRO")}
        parsed.append((name, sql, writes, lazy, {w.lower() for w in _WORD.findall(text)}))
    expands: dict[str, set[str]] = {}  # view/macro name -> words of its defining file
    for _, _, _, lazy, words in parsed:
        for n in lazy:
            expands[n] = words
    units = []
    for i, (name, sql, writes, _, words) in enumerate(parsed):
        seen, todo = set(words), list(words & expands.keys())
        while todo:  # a view or macro mentions what its file mentions, transitively
            more = expands[todo.pop()] - seen
            seen |= more
            todo.extend(more & expands.keys())
        after = tuple(n2 for n2, _, w2, _, words2 in parsed[:i] if w2 & seen or writes & words2)
        units.append(Unit(name, sql, after))
    return units


def workers() -> int:
    """Concurrent files: half the cores, 2 to 8. Measured on a 2-rank real store (report with
    the HTML's extras, median of 5): 2 cores, 1/2/4 files: 0.72-0.80/0.55-0.61/0.64-0.68 s;
    32 cores (best of 3), 1/2/4/8 files: 0.89-0.97/0.76-0.77/0.67-0.72/0.63-0.64 s."""
    return min(8, max(2, (os.cpu_count() or 2) // 2))


def run(con: duckdb.DuckDBPyConnection, units: Sequence[Unit],
        setup: Callable[[duckdb.DuckDBPyConnection], None], n_workers: int | None = None) -> None:
    """Execute `units` on cursors of `con` (each prepared by `setup`), dependencies first."""
    futures: dict[str, Future] = {}
    cursors: list[duckdb.DuckDBPyConnection] = []
    local = threading.local()

    def cursor() -> duckdb.DuckDBPyConnection:
        if not hasattr(local, "cur"):
            local.cur = con.cursor()
            setup(local.cur)
            cursors.append(local.cur)
        return local.cur

    def one(u: Unit) -> None:
        for dep in u.after:
            futures[dep].result()  # re-raises a dependency's failure
        with phase(f"analyze: {u.name}"):
            cursor().execute(u.sql)

    pool = ThreadPoolExecutor(max_workers=n_workers or workers())
    try:
        for u in units:
            futures[u.name] = pool.submit(one, u)
        for u in units:
            futures[u.name].result()
    except BaseException:  # a failed file or Ctrl-C: queued files never start, running ones stop
        for f in futures.values():
            f.cancel()
        for c in list(cursors):
            c.interrupt()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for c in cursors:
            c.close()
