"""Run the analysis SQL over a merged store; hand named views to the report and the rules.

All row-level work (interval unions, gap attribution, collective matching, step detection)
is SQL in `metrics/sql/NN_*.sql`, executed in an in-memory DuckDB that attaches the store
read-only (independent files at the same time: sqlrun.py). Each file's header says what it
reads and which tables/views it provides; shared idioms are macros in `00_macros.sql`.
Python only reads the small result views.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from orchestrator import sqlmodules
from orchestrator.duckdb_memory import cores as orch_cores
from orchestrator.duckdb_memory import limit, out_of_memory
from orchestrator.errors import OrchError
from orchestrator.metrics import rankpass, sqlrun
from orchestrator.sqltext import attach, execute, set_option
from orchestrator.store import map_tables
from orchestrator.store.evidence import JobEvidence
from orchestrator.store.tables import STORE_VERSION
from orchestrator.store.views import relocate
from orchestrator.timings import phase

# The store layout this analysis reads is the one collect writes (history: store/tables.py).
STORE_VERSIONS = {str(STORE_VERSION)}
# DuckDB's own assertion failures, and the invalidated database they leave (see `analysis`).
INTERNAL = (duckdb.InternalException, duckdb.FatalException)


@dataclass(frozen=True)
class Options:
    """What the user chose for one analysis (CLI flags, or `orchestrator.analyze(...)` kwargs)."""

    gap_ms: float = 1.0
    steps: tuple[int, int] | None = None  # inclusive step numbers; None = all but the first
    top_gaps: int = 10
    steps_from: str | None = None  # regex naming the NVTX ranges that are steps (overrides detection)
    microbatches: int | None = None  # pipeline microbatches per step, for the bubble's theory
    tables: str = "phases"  # nsys-stats tables the terminal prints: phases | all (JSON/HTML always get all)
    stats_scope: str = "window"  # window: the selected steps; capture: everything (what `nsys stats` sums)

    def __post_init__(self) -> None:
        if not (isinstance(self.gap_ms, int | float) and math.isfinite(self.gap_ms) and self.gap_ms > 0):
            raise OrchError(f"--gap-ms {self.gap_ms}: use a positive number of milliseconds, e.g. --gap-ms 1")
        if self.microbatches is not None and self.microbatches < 1:
            raise OrchError(f"--microbatches {self.microbatches}: use a positive integer")
        if self.tables not in ("phases", "all"):
            raise OrchError(f"--tables {self.tables}: use phases or all")
        if self.stats_scope not in ("window", "capture"):
            raise OrchError(f"stats_scope {self.stats_scope!r}: use window or capture")


def parse_steps(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    lo, sep, hi = text.partition(":")
    try:
        a, b = int(lo), int(hi if sep else lo)
    except ValueError:
        raise OrchError(f"--steps {text!r}: use A:B with step numbers, e.g. --steps 3:8") from None
    if a > b or a < 0 or b > 2**31 - 1:
        raise OrchError(f"--steps {text!r}: A must be <= B, both between 0 and {2**31 - 1}")
    return a, b


def check_regex(pattern: str | None) -> str | None:
    """Compile a --steps-from pattern with DuckDB's own engine, so a bad one fails in one line."""
    if pattern is None:
        return None
    try:
        execute(duckdb.connect(), "SELECT regexp_matches('', ?)", [pattern])
    except duckdb.Error as e:
        raise OrchError(f"--steps-from {pattern!r} is not a valid regular expression "
                        f"({str(e).splitlines()[0]}); e.g. --steps-from '^train_step'") from None
    return pattern


def attach_store(store: Path) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with the store attached read-only, its tables found by name."""
    if not Path(store).is_file():
        raise OrchError(f"{store} does not exist; run `orch collect` first")
    con = duckdb.connect()
    try:
        attach(con, store, "store", read_only=True)
    except duckdb.Error as e:
        con.close()
        reason = str(e).splitlines()[0]
        raise OrchError(f"{store} is not a readable orch store ({reason}); re-run `orch collect`") from None
    try:
        meta = dict(con.execute("SELECT key, value FROM store.meta").fetchall())
    except duckdb.Error:
        meta = {}  # not an orch store: check_store_version or the first query says so
    try:
        relocate(con, Path(store), meta)
    except BaseException:
        con.close()
        raise
    rankpass.schemas(con)
    session(con)
    limit(con)  # analysis tables past the limit spill to disk instead of growing (duckdb_memory.py)
    set_option(con, "threads", analysis_threads(store_rows(con, meta)))
    return con


def store_rows(con: duckdb.DuckDBPyConnection, meta: dict[str, str] | None = None) -> int:
    """Rows in the attached store's tables, from DuckDB's catalog (no scan), and in its event
    tables that are views over the parts (the reduce counted them): the analysis's work,
    whatever the compression made of the file's size."""
    n, = con.execute("SELECT coalesce(sum(estimated_size), 0) FROM duckdb_tables() "
                     "WHERE database_name = 'store'").fetchone()
    return int(n) + int((meta or {}).get("event_view_rows") or 0)


def analysis_threads(store_rows: int, cores: int | None = None) -> int:
    """DuckDB threads for one analysis: one per 100k store rows, at least 4, at most the cores.
    A small store's statements are too small to share out; files run side by side anyway
    (sqlrun.py). Rows, not the file's size, measure the work: compression hides it, and a
    rule by file size keeps a large store at too few threads (docs/benchmarks-code.md)."""
    cores = cores or orch_cores()
    return max(1, min(cores, max(4, int(store_rows) // 100_000)))


def session(con: duckdb.DuckDBPyConnection) -> None:
    """Per-connection settings, for the analysis connection and each of its cursors. Names
    resolve to the analysis objects (in-memory catalog) first, then to the per-rank pass's own
    (rankpass.py), then to the store's tables;
    the analysis creates its objects in memory, so the store is never written.
    DuckDB turns an ASOF join whose left side it ESTIMATES below 64 rows into a nested loop
    over the whole right side; its estimates of our CTEs are often far too low (NVTX ranges x
    CUDA calls as a loop, several times slower: docs/benchmarks-code.md). The ASOF joins here are the
    linear paths on purpose: always take them."""
    con.execute(f"SET search_path = '{rankpass.SEARCH}'")
    con.execute("SET asof_loop_join_threshold = 0")


# The options a map's analysis runs with (collect/summarize.py), and those of them that decide a
# rank's scope, in which the report takes the map's statistics (21_stats_scope.sql).
MAP_OPTIONS = Options()
_SCOPE = ("gap_ms", "steps", "steps_from", "stats_scope")


def map_options(opts: Options) -> bool:
    """Whether the options that decide a rank's scope are the map's (params.map_options): only
    then can a rank's GPU ops be the map's (13_steps_mapped.sql)."""
    return all(getattr(opts, f) == getattr(MAP_OPTIONS, f) for f in _SCOPE)


def run_sql(con: duckdb.DuckDBPyConnection, opts: Options, only: Sequence[str] | None = None,
            workers: int | None = None) -> None:
    """Create every analysis table/view (in memory, the store stays untouched), independent
    files at the same time (sqlrun.py). `only`: these files and what they depend on (the
    map's per-rank tables, map_tables.py); `workers`: files at once (default sqlrun.workers)."""
    prepare(con, opts)
    units = _plan() if only is None else sqlrun.needed(_plan(), only)
    with phase("analyze: SQL (wall)"):
        sqlrun.run(con, units, session, workers)


def prepare(con: duckdb.DuckDBPyConnection, opts: Options) -> None:
    """What the SQL files read besides the store: the options, and the map's per-rank tables
    (empty where the store has none); and which store names the per-rank pass narrows to its
    ranks (rankpass.catalog)."""
    map_tables.create_missing(con)
    create_params(con, opts)
    rankpass.catalog(con)


# The names of input-pipeline ranges and phases (a data loader's, a batch fetch): the rules read
# it here (is_input_range) and the SQL as params.input_re.
DATA_RANGE = re.compile(r"data|load|batch|input|fetch|collate|sampler|prefetch", re.I)
# A gap outside every range is named after the call its loop thread was in (40_gaps.sql): a CUDA or
# OS call's name, never the input pipeline's, whatever words it holds (`cuLibraryLoadData`, the
# driver loading a kernel's module on first use). The SQL reads it as params.call_gap.
CALL_GAP = "loop thread in "


def is_input_range(name: str) -> bool:
    """Whether a range group or critical-path phase is the input pipeline's (DATA_RANGE), not a
    call's (CALL_GAP)."""
    return not name.startswith(CALL_GAP) and bool(DATA_RANGE.search(name))

_PARAMS = ("CREATE OR REPLACE TABLE params (gap_ns BIGINT, step_lo INTEGER, step_hi INTEGER, steps_from VARCHAR, "
           "microbatches INTEGER, stats_scope VARCHAR, ended_early BOOLEAN, map_sql VARCHAR, map_options BOOLEAN, "
           "input_re VARCHAR, call_gap VARCHAR)")


def create_params(con: duckdb.DuckDBPyConnection, opts: Options) -> None:
    """The `params` table every SQL file reads the user's options from."""
    lo, hi = opts.steps if opts.steps else (None, None)
    con.execute(_PARAMS)
    execute(con, "INSERT INTO params VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [round(opts.gap_ms * 1e6), lo, hi, opts.steps_from, opts.microbatches, opts.stats_scope, ended_early(con),
             map_sql(), map_options(opts), "(?i)" + DATA_RANGE.pattern, CALL_GAP])


def ended_early(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the store's job did not complete (failed, timed out, cancelled), from what
    `orch collect` kept of its status; False for a store built from reports alone."""
    try:
        row = con.execute("SELECT max(value) FROM meta WHERE key = 'job'").fetchone()
    except duckdb.Error:
        return False
    ev = JobEvidence.from_store(row[0] if row else None)
    return ev is not None and ev.ended_early


@functools.cache
def map_sql() -> str:
    """A digest of the SQL that computes the map's per-rank tables (the files they need, in plan
    order, comments left out: sqlmodules.code) and of their declared columns: rows a map made
    with other statements are never taken."""
    h = hashlib.sha256()
    for u in sqlrun.needed(_plan(), map_tables.SQL_FILES):
        h.update(sqlmodules.code(u.sql).encode())
    h.update(repr(map_tables.SUMMARIES).encode())
    return h.hexdigest()[:16]


@functools.cache
def _plan() -> list[sqlrun.Unit]:
    return rankpass.plan(sqlmodules.analysis_modules())


class Views:
    """Read access to the analysis views, as lists of dicts in a stable order (cached)."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self._cache: dict[str, list[dict[str, Any]]] = {}
        self._grouped: dict[str, dict[int, list[dict[str, Any]]]] = {}

    def rows(self, view: str) -> list[dict[str, Any]]:
        if view not in self._cache:
            self._cache[view] = self.query("SELECT * FROM query_table(?::VARCHAR) ORDER BY ALL", [view])
        return self._cache[view]

    def by_rank(self, view: str) -> dict[int, dict[str, Any]]:
        return {r["rank"]: r for r in self.rows(view)}

    def of_rank(self, view: str, rank: int) -> list[dict[str, Any]]:
        """The rows of a view with several rows a rank, of one rank (grouped once: a rule asks
        for every rank's)."""
        rows = self.rows(view)  # (each time: a rule's reads are checked there)
        if view not in self._grouped:
            grouped: dict[int, list[dict[str, Any]]] = {}
            for r in rows:
                grouped.setdefault(r["rank"], []).append(r)
            self._grouped[view] = grouped
        return self._grouped[view].get(rank, [])

    def query(self, sql: str, params: list | None = None) -> list[dict[str, Any]]:
        cur = execute(self.con, sql, params)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    def scalar(self, sql: str, params: list | None = None) -> Any:
        row = execute(self.con, sql, params).fetchone()
        return row[0] if row else None


def check_store_version(con: duckdb.DuckDBPyConnection, store: Path) -> None:
    """A store of another layout is refused in one line, before a query fails on a missing table."""
    version = Views(con).scalar("SELECT value FROM meta WHERE key = 'store_version'")
    if version is not None and str(version) not in STORE_VERSIONS:
        raise OrchError(f"{store} was written by another orch (store version {version}); "
                        "re-run `orch collect` with this orch")


def analysis(store: Path, opts: Options, writer: duckdb.DuckDBPyConnection | None = None,
             only: Sequence[str] | None = None, threads: int | None = None
             ) -> tuple[duckdb.DuckDBPyConnection, Views]:
    """Open `store`, run the SQL, and return the connection (caller closes) and its views.
    `writer`: the collect's own connection, still finishing the store (collect.collecting):
    the analysis runs on a cursor of it instead of opening the file. `only`: see run_sql.
    `threads`: DuckDB's threads and the files run at once (a map task's cores), instead of
    what the store's size asks for."""
    try:
        try:
            con = _analysed(store, opts, writer, only, threads)
        except INTERNAL:
            if writer is not None:  # the collect's database is invalidated with it: nothing to retry on
                raise
            # DuckDB's own assertion, seen to depend on its threads' timing (a parallel window's
            # finalize): the analysis runs once more on a fresh in-memory database.
            con = _analysed(store, opts, writer, only, threads)
    except duckdb.Error as e:
        if writer is not None and checkpoint_race(e):
            raise  # the caller collects again, the checkpoint first (cli/report.py)
        where = sqlrun.failed_file(e)
        first = f"{where}: {str(e).splitlines()[0]}" if where else str(e).splitlines()[0]
        if isinstance(e, INTERNAL):
            raise OrchError(f"analysis of {store} hit an internal DuckDB error ({first}); run the "
                            "command again, and if it repeats report it with the store") from None
        raise out_of_memory(e, f"analysis of {store}") or OrchError(
            f"analysis failed on {store} ({first}); re-run `orch collect` to rebuild the store") from None
    return con, Views(con)


def checkpoint_race(e: BaseException) -> bool:
    """Whether DuckDB's checkpoint, writing the store while an analysis reads it on another
    cursor (`on_writer`), failed on its own race and invalidated the database."""
    return isinstance(e, duckdb.Error) and "Corrupted in-memory column" in str(e)


def _analysed(store: Path, opts: Options, writer: duckdb.DuckDBPyConnection | None,
              only: Sequence[str] | None, threads: int | None) -> duckdb.DuckDBPyConnection:
    """One analysis attempt (see `analysis`): the connection with every table made, or the
    DuckDB error with the connection closed."""
    con = attach_store(store) if writer is None else on_writer(writer)
    try:
        if threads is not None:
            set_option(con, "threads", max(1, threads))
        check_store_version(con, store)
        run_sql(con, opts, only, workers=threads)
    except BaseException:
        con.close()
        raise
    return con


def on_writer(writer: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """An analysis connection on the collect's DuckDB (`orch analyze`): a cursor starts in the
    writer's in-memory catalog, where the analysis objects go, with the store attached as
    `store`, as `attach_store` arranges it; the memory limit and spill directory are the
    writer's. The store's rows are read where they are (memory or file) while the checkpoint
    writes them, instead of after it, from a reopened file."""
    con = writer.cursor()
    rankpass.schemas(con)
    session(con)
    set_option(con, "threads", analysis_threads(store_rows(con)))
    return con
