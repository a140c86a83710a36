"""Run the analysis SQL files concurrently where they do not depend on each other.

Most of the analysis statements are small and latency-bound: on two ranks DuckDB keeps about
one core busy however many it has, and a report waited for every file one after the other. The
files form a DAG (after `30_intervals.sql` the collectives, gaps, host syncs, phases and
API tables branch apart): on a 2-rank real store the longest chain is 0.25 s of 0.59 s.

The DAG comes from each file's declared header (sqlmodules.py), which
tests/test_sql_modules.py holds to what DuckDB really binds: a file waits for every earlier
file that provides or adds rows to (`Writes`) a name it reads or writes, and a file that adds
rows to a table waits for every earlier file that reads it, directly or through a view of an
earlier file (the reader must finish first). A table is complete once its file is, so the
waits are transitive: a file needs to wait only for its direct providers.

Each worker runs on its own cursor of the one database (DuckDB releases the GIL while it
executes); tables are shared through the in-memory catalog (not TEMP: temp objects are
per connection). A failed file (or Ctrl-C) cancels the files not started and interrupts the
running ones, and the first error is raised; workers take files in file order, so every file
a worker waits for is already running or done (no deadlock).

Once DuckDB spills (the analysis' tables have outgrown its memory cap, duckdb_memory.py), the
files taken after it run one after the other on the first worker's cursor (another worker ends
the one file it holds). What a second cursor holds outside the cap raises the process' peak,
even with one file at a time, and on a store that large the files' statements are big enough
to keep the cores busy alone (docs/benchmarks-code.md). On a store whose tables fit, nothing
spills and the files overlap, where they buy the most.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import duckdb

from orchestrator import progress, sqlmodules
from orchestrator.duckdb_memory import cores
from orchestrator.timings import phase


@dataclass(frozen=True)
class Unit:
    """One SQL file: its name, its text and the earlier units it must wait for; `path`: the
    search path it runs on, where not the connection's; `call`: what it runs instead of SQL;
    `drop`: what it runs last, dropping its private helpers nothing can read after it
    (sqlmodules.disposable; not in `sql`, which the map's digest hashes)."""

    name: str
    sql: str
    after: tuple[str, ...]
    path: str | None = None
    call: Callable[[duckdb.DuckDBPyConnection], None] | None = None
    drop: str = ""


def plan(files: Sequence[tuple[str, str]]) -> list[Unit]:
    """(name, sql) in execution order -> units with their dependencies (see module docstring)."""
    return plan_modules(sqlmodules.parse_all(files))


def plan_modules(modules: Sequence[sqlmodules.Module]) -> list[Unit]:
    """Parsed modules in execution order -> units with their dependencies."""
    seen: dict[str, set[str]] = {}  # name -> what reading it reads, through views of earlier files
    units = []
    for i, m in enumerate(modules):
        needs = set(m.reads) | set(m.writes)
        after = tuple(e.file for e in modules[:i]
                      if (e.names | set(e.writes)) & needs or set(m.writes) & seen_by(e, seen))
        units.append(Unit(m.file, m.sql, after, drop="".join(
            f"DROP {kind} IF EXISTS {name};\n" for kind, name in sqlmodules.disposable(m))))
        for p in m.provides:
            seen[p.name] = seen_by(m, seen)
    return units


def needed(units: Sequence[Unit], files: Sequence[str]) -> list[Unit]:
    """The units of `files` and every unit they wait for, directly or not, in plan order."""
    need = set(files)
    unknown = need - {u.name for u in units}
    if unknown:
        raise ValueError(f"no such SQL file: {sorted(unknown)}")
    for u in reversed(units):
        if u.name in need:
            need.update(u.after)
    return [u for u in units if u.name in need]


def seen_by(m: sqlmodules.Module, seen: dict[str, set[str]]) -> set[str]:
    """Everything module `m` reads, directly or through the views it reads."""
    return set(m.reads).union(*(seen.get(r, set()) for r in m.reads))


def failed_file(e: BaseException) -> str | None:
    """The SQL file whose statement raised `e` in `run`, for the error the user sees."""
    return getattr(e, "sql_file", None)


def workers() -> int:
    """Concurrent files: half the cores, 2 to 8. More files than half the cores compete for
    them (on 2 cores 4 files are slower than 2), and past 8 there is little left to gain
    (docs/benchmarks-code.md); one where orch may take one thread (duckdb_memory.cores)."""
    n = cores()
    return min(8, n, max(2, n // 2))


def execute(cur: duckdb.DuckDBPyConnection, u: Unit, setup: Callable[[duckdb.DuckDBPyConnection], None]) -> None:
    """Run one unit on `cur`: on its own search path where it has one, then `setup` again, so
    that the cursor is its own for the next unit it runs."""
    if u.path:
        cur.execute(f"SET search_path = '{u.path}'")
    if u.call:
        u.call(cur)
    else:
        cur.execute(u.sql)
    if u.drop:
        cur.execute(u.drop)
    if u.path:
        setup(cur)


# Whether DuckDB has spilled: the analysis' tables have outgrown its memory cap.
_SPILLED = "SELECT coalesce(sum(temporary_storage_bytes), 0) > 0 FROM duckdb_memory()"


def run(con: duckdb.DuckDBPyConnection, units: Sequence[Unit],
        setup: Callable[[duckdb.DuckDBPyConnection], None], n_workers: int | None = None) -> None:
    """Execute `units` on cursors of `con` (each prepared by `setup`), dependencies first: each
    worker takes the next file in plan order on its own cursor, until none is left or, but for
    the first worker, DuckDB spills (module docstring)."""
    done = {u.name: Future() for u in units}
    order = iter(units)
    take = threading.Lock()
    cursors: list[duckdb.DuckDBPyConnection] = []
    spilled, stopping = threading.Event(), threading.Event()

    def next_unit(first: bool) -> Unit | None:
        if stopping.is_set() or (spilled.is_set() and not first):
            return None
        with take:
            return next(order, None)

    def worker(first: bool) -> None:
        cur = con.cursor()
        cursors.append(cur)
        setup(cur)
        while (u := next_unit(first)) is not None:
            try:
                for dep in u.after:
                    done[dep].result()  # re-raises a dependency's failure
                if not spilled.is_set() and cur.execute(_SPILLED).fetchone()[0]:
                    spilled.set()
                with phase(f"analyze: {u.name}"):
                    execute(cur, u, setup)
            except BaseException as e:
                if isinstance(e, duckdb.Error) and not hasattr(e, "sql_file"):
                    e.sql_file = u.name  # type: ignore[attr-defined]  # read by failed_file
                done[u.name].set_exception(e)
                stopping.set()
                return
            done[u.name].set_result(None)
            shown.advance()

    n = max(1, min(n_workers or workers(), len(units)))
    pool = ThreadPoolExecutor(max_workers=n)
    with progress.task("analysis (SQL files)", total=len(units)) as shown:
        try:
            for f in [pool.submit(worker, i == 0) for i in range(n)]:
                f.result()
            for u in units:  # the first failure in plan order, not a dependent's
                if done[u.name].done() and done[u.name].exception():
                    raise done[u.name].exception()
        except BaseException:  # a failed file or Ctrl-C: no file starts, the running ones stop
            stopping.set()
            for c in list(cursors):
                c.interrupt()
            raise
        finally:
            pool.shutdown(wait=True)
            for c in cursors:
                c.close()
