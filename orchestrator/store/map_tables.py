"""Per-rank tables computed in the map, next to each rank's data, and read by the analysis.

A statistic that needs one rank's events only (the GPU's busy intervals and time split of
30_intervals.sql, the idle gaps by CPU range, the short gaps and the intervals between steps of
40_gaps.sql, what the loop thread did in the gaps of 45_cpu_state.sql, the host syncs of
55_host_sync.sql, each rank's own replay of 55_own_replay.sql, the GPU the rank's kernels ran on
of 13_rank_device.sql, the copies in the window of 90_gpu_work.sql, the per-rank rows of the
phase, kernel and memory-operation tables of 92, 94 and 96, the CUDA API / OS runtime and thread
tables of 98_api_osrt.sql, the nsys-analyze tables of 99_nsys_rules.sql and 99_slice_idle.sql) costs
the analysis a pass over every event of every rank: at 1,024 CPU ranks most of the report's SQL
(docs/scale.md); at 256 real GPU ranks half of it (docs/history/benchmarks-after-job.md). The map
(collect/summarize.py) runs the same SQL on its one rank with the default options and writes the
small results as parts; the reduce stores them in the `map_*` tables below. The analysis takes a
rank's mapped rows only where the map's scopes are the ones it would use itself (the same
selected-steps window on the CPU and the GPU side, step count, process, gap threshold and SQL:
map_ranks in 21_stats_scope.sql) and maps the other ranks itself, with the same statements
(metrics/rankpass.py): a report with other options (`--steps`, `--steps-from`, `--gap-ms`, the
whole capture), a job stopped early, a rank whose steps the job-wide detection chose differently,
a store mapped by another version of these files, so the report is the same either way
(tests/test_parts.py on every real fixture).

Three keys, from the loosest to the strictest, each checked by the analysis itself:
- the SQL (map_done, 05_mapped.sql): what needs the rank's events alone, whatever the job and the
  options (the optimizer's launches, the CUDA calls' counts and busiest thread);
- the steps (ops_mapped, 13_steps_mapped.sql): what needs the rank's events and its steps (the
  GPU ops per step that the window is made of, the NCCL kernels the collectives are matched
  from, the compute launched between steps: 14_gpu_ops.sql), where the options that decide a
  rank's scope are the map's too, so that these ranks are among map_ranks and no file needs
  their other ops (`gpu_ops` holds the other ranks' only);
- the scopes (map_ranks): the window statistics, the tables of the files marked `-- Map: per
  rank`, which the analysis takes whole from the map or from its own per-rank pass.
With the three, the report reads a mapped rank's CUDA calls, kernels, copies, memsets and
OS-runtime calls only for the ranks it draws in the timeline, and the reduce leaves them in the
parts (store/views.py, IF_MAPPED). Its NVTX ranges are still read (steps, NCCL's byte counts,
the stages, where a stopped rank ended), and its compute islands by the critical path.

The small tables travel stacked in one part per rank (STACK), the compute islands in their own.

Each table's columns and their types are declared once, in the header entry of the analysis
table it holds (metrics/sql, read by orchestrator/sqlmodules.py: `name(rank INTEGER, ...)`); the
store's schema, the map's parts and the stacked part's slots all come from it, so a store
without them (the in-process ingest, an older store) gets them empty and the SQL binds. A
change to them changes what a map writes: bump collect/parts.MAP_VERSION with it, so that parts
of the old shape are mapped again instead of misread (the analysis' digest of them, engine.map_sql,
changes too; tests/test_map_shape.py pins the shape beside the version).
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

from orchestrator import sqlmodules

# The slot type of each declared column type in the stacked part (below): integers share BIGINT
# slots, the other types have their own.
_SLOT = {"INTEGER": "BIGINT", "BIGINT": "BIGINT", "DOUBLE": "DOUBLE", "VARCHAR": "VARCHAR", "BOOLEAN": "BOOLEAN"}


@dataclass(frozen=True)
class Summary:
    """One mapped table: its store name, the analysis query that fills it, its columns; `own`:
    written as a part of its own (a large table) rather than in the rank's stacked part."""

    table: str
    source: str
    columns: tuple[tuple[str, str], ...]
    own: bool = False
    clock: tuple[str, ...] = ()  # the columns that are times on the rank's own clock

    def taken(self, ranks: str) -> str:
        """The map's rows of the ranks in `ranks` (a relation of rank and off, the rank's clock
        offset in the store), their times moved onto the store's clock."""
        moved = ", ".join(f'm."{c}" + k.off AS "{c}"' for c in self.clock)
        return (f"SELECT m.*{f' REPLACE ({moved})' if moved else ''} "
                f"FROM {self.table} m JOIN {ranks} k USING (rank)")

    def ddl(self, schema: str = "") -> str:
        cols = ", ".join(f'"{c}" {t}' for c, t in self.columns)
        return f"CREATE TABLE IF NOT EXISTS {schema}{self.table} ({cols})"

    def select(self) -> str:
        """The analysis rows cast to the declared types (what the map writes)."""
        cols = ", ".join(f'CAST("{c}" AS {t}) AS "{c}"' for c, t in self.columns)
        return f"SELECT {cols} FROM {self.source}"

    def slots(self) -> list[tuple[str, str, str]]:
        """(column, declared type, slot) of each column but the rank, in order: the n-th column of
        a slot type goes to that type's n-th slot (`BIGINT_0`, `VARCHAR_1`, ...)."""
        seen: dict[str, int] = {}
        out = []
        for c, t in self.columns[1:]:
            k = _SLOT[t]
            out.append((c, t, f"{k}_{seen.get(k, 0)}"))
            seen[k] = seen.get(k, 0) + 1
        return out

    def stacked(self) -> str:
        """The analysis rows as rows of the stacked part: the table's name, the rank, the slots."""
        cols = "".join(f', CAST("{c}" AS {_SLOT[t]}) AS {slot}' for c, t, slot in self.slots())
        return f"SELECT '{self.table}' AS tbl, CAST(\"rank\" AS INTEGER) AS \"rank\"{cols} FROM {self.source}"

    def unstacked(self, stack: str) -> str:
        """This table's rows of `stack` (a relation of the stacked part's columns), as declared."""
        cols = "".join(f', CAST({slot} AS {t}) AS "{c}"' for c, t, slot in self.slots())
        return f"SELECT \"rank\"{cols} FROM {stack} WHERE tbl = '{self.table}'"


# Each mapped table: its store name and the analysis table or view it holds, whose entry in its
# file's header (metrics/sql) gives its columns their types: the one declaration of them; then
# the columns that are times, on the rank's own clock in the map's one-rank store (its clock
# offset there is 0), which the analysis moves onto the store's where it takes the map's rows in
# place of its own per-rank pass (metrics/rankpass.py). The steps' table is the key of the GPU
# ops per step (13_steps_mapped.sql), never taken.
_MAPPED: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # The key (21_stats_scope.sql, rank_scope).
    ("map_scope", "rank_scope", ()),
    ("map_phase_rows", "phase_rows", ()),
    ("map_api_table", "api_table", ()),
    ("map_thread_table", "thread_table", ()),
    ("map_sync_copies", "sync_copies", ()),
    ("map_sync_api_calls", "sync_api_calls", ()),
    # Nsys' gpu-low-util slices.
    ("map_gpu_slices", "gpu_slices", ("s", "e")),
    # The GPU's compute intervals (what the critical path reads across ranks), with their
    # running total (upto); then each class's time in the window.
    ("map_compute_islands", "compute_islands", ("s", "e")),
    ("map_gpu_time", "gpu_time", ()),
    # The GPU's idle gaps of at least --gap-ms with the CPU range that explains each (the map's
    # threshold is in its scope key).
    ("map_gap_attr", "gap_attr", ("s", "e")),
    ("map_between_steps", "between_steps", ("s", "e")),
    # What the gaps are made of (40_gaps.sql, 45_cpu_state.sql, 99_slice_idle.sql): the short ones,
    # the OS calls the loop thread was in during the long ones and the Python functions it ran,
    # the idle of each slice.
    ("map_small_gaps", "small_gaps", ()),
    ("map_alloc_gaps", "alloc_gaps", ()),
    ("map_osrt_traced", "osrt_traced", ()),
    ("map_gap_cpu", "gap_cpu", ()),
    ("map_gap_python", "gap_python", ()),
    ("map_slice_idle", "slice_idle", ()),
    # Host syncs and the GPU idle after each; their per-rank totals.
    ("map_host_syncs", "host_syncs", ("start", "end")),
    ("map_sync_idle", "sync_idle", ("start", "end")),
    # Where the CPU blocked on its GPU (56_cpu_blocks.sql): the replay's bounds on its launches.
    ("map_cpu_blocks", "cpu_blocks", ("start", "end", "done", "lb")),
    ("map_queue_wait", "queue_wait", ("launch",)),
    ("map_sync_stats", "sync_stats", ()),
    # Each rank's own GPU work replayed without its host syncs, without its wait for input.
    ("map_own_replay", "own_replay", ()),
    # What derives from the rank's own events and steps alone: taken wherever the map ran this
    # SQL (the optimizer's launches: map_done, 05_mapped.sql) and where its steps are the report's
    # (the GPU ops per step, the NCCL kernels, the compute between steps: 14_gpu_ops.sql),
    # whatever the options.
    ("map_opt_launch", "opt_launch", ("start",)),
    ("map_steps", "steps", ()),
    ("map_step_ops", "step_ops", ("s", "e")),
    ("map_comm_ops", "comm_ops", ("start", "end", "launch")),
    ("map_offstep", "offstep_islands", ("s", "e")),
    # The rank's CUDA calls, counted and picked (11_cuda_calls.sql): taken wherever the map ran
    # this SQL, so that the calls themselves stay in the parts.
    ("map_cuda_calls", "cuda_calls", ()),
    ("map_busy_thread", "busy_thread", ()),
    ("map_last_call", "last_call", ("end_ns",)),
    ("map_rank_device", "rank_device", ()),
    # Window statistics (map_ranks, as above): the CUDA calls in the window, the allocator's,
    # the copies', the kernels' and memory operations' tables, the CUDA graphs'.
    ("map_capture_api", "capture_api", ()),
    ("map_alloc_calls", "alloc_calls", ()),
    ("map_kernel_stats", "kernel_stats", ()),
    ("map_memcpy_window", "memcpy_window", ()),
    ("map_mem_rows", "mem_rows", ()),
    ("map_kernel_rows", "kernel_rows", ()),
    ("map_graph_usage", "graph_usage", ()),
    ("map_graph_eager", "graph_eager_steps", ()),
)
# Written as parts of their own (large tables), not in the rank's stacked part.
_OWN = ("map_compute_islands",)


def _summaries() -> tuple[Summary, ...]:
    typed = {p.name: p for m in sqlmodules.analysis_modules() for p in m.provides if p.types}
    missing = [src for _, src, _ in _MAPPED if src not in typed]
    if missing:  # a header that lost its types: the map's columns would be unknown
        raise sqlmodules.HeaderError(f"the map writes {missing}, whose headers give their columns no types")
    return tuple(Summary(table, src, tuple(zip(typed[src].columns, typed[src].types, strict=True)), table in _OWN,
                         clock) for table, src, clock in _MAPPED)


SUMMARIES = _summaries()
# A rank's small tables travel as one part, stacked: one row per table row, the table's name,
# the rank and typed slots that each table maps its columns onto (Summary.slots). Reading a
# part costs per file and per column more than per row, and the small tables are most of a
# map's tables and few of its rows (docs/history/scale-map-stats.md, "One stacked part per rank").
STACK = "map_stack"


def stack_columns() -> list[tuple[str, str]]:
    """The stacked part's columns: tbl, rank and as many slots of each type as a table needs."""
    need: dict[str, int] = {}
    for s in SUMMARIES:
        if not s.own:
            for _, _, slot in s.slots():
                k, n = slot.rsplit("_", 1)
                need[k] = max(need.get(k, 0), int(n) + 1)
    return [("tbl", "VARCHAR"), ("rank", "INTEGER"), *((f"{k}_{i}", k) for k, n in need.items() for i in range(n))]


def stacked_select() -> str:
    """Every small table's rows as the stacked part's rows (what the map writes)."""
    body = " UNION ALL BY NAME ".join(f"({s.stacked()})" for s in SUMMARIES if not s.own)
    cols = ", ".join(f'CAST("{c}" AS {t}) AS "{c}"' for c, t in stack_columns())
    return f"SELECT {cols} FROM ({body})"


# The analysis files whose tables the map computes (and, through their dependencies, the
# steps, window and scope they are measured in).
SQL_FILES = ("06_opt_launch.sql", "11_cuda_calls.sql", "13_rank_device.sql", "30_intervals.sql", "40_gaps.sql",
             "45_cpu_state.sql", "55_host_sync.sql", "55_own_replay.sql", "56_cpu_blocks.sql", "66_cuda_graphs.sql",
             "67_capture_api.sql", "90_gpu_work.sql", "92_phases.sql", "94_kernel_rows.sql", "96_memory_ops.sql",
             "98_api_osrt.sql", "99_nsys_rules.sql", "99_slice_idle.sql")


def create_missing(con: duckdb.DuckDBPyConnection) -> None:
    """Empty in-memory `map_*` tables where the attached store has none, or one of another
    shape (another orch's), so that the SQL binds on every store and takes no mapped rank
    there: the in-memory table comes first on the search path (engine.session)."""
    have: dict[str, list[str]] = {}
    for table, column in con.execute("SELECT table_name, column_name FROM duckdb_columns() "
                                     "WHERE database_name = 'store' ORDER BY table_name, column_index").fetchall():
        have.setdefault(table, []).append(column)
    for s in SUMMARIES:
        if have.get(s.table) != [c for c, _ in s.columns]:
            con.execute(s.ddl("memory.main."))
