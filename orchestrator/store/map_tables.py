"""Per-rank tables computed in the map, next to each rank's data, and read by the analysis.

A statistic that needs one rank's events only (the GPU's busy intervals and time split of
30_intervals.sql, the idle gaps by CPU range, the short gaps and the intervals between steps of
40_gaps.sql, what the loop thread did in the gaps of 45_cpu_state.sql, the host syncs of
55_host_sync.sql, the GPU the rank's kernels ran on of 13_rank_device.sql, the copies in the
window of 90_gpu_work.sql, the per-rank rows of the phase, kernel and memory-operation tables of
92, 94 and 96, the CUDA API / OS runtime and thread tables of 98_api_osrt.sql, the nsys-analyze
tables of 99_nsys_rules.sql and 99_slice_idle.sql) costs
the analysis a pass over every event of every rank: at 1,024 CPU ranks most of the report's SQL
(docs/scale.md); at 256 real GPU ranks half of it (docs/history/benchmarks-after-job.md). The map
(collect/summarize.py) runs the same SQL on its one rank with the default options and writes the
small results as parts; the reduce stores them in the `map_*` tables below. The analysis takes a
rank's mapped rows only where the map's scopes are the ones it would use itself (the same
selected-steps window on the CPU and the GPU side, step count, process, gap threshold and SQL:
map_ranks in 21_stats_scope.sql) and computes the other ranks itself: a report with other options
(`--steps`, `--steps-from`, `--gap-ms`, the whole capture), a job stopped early, a rank whose steps
the job-wide detection chose differently, a store mapped by another version of these files, all
fall back to the central SQL, so the report is the same either way (tests/test_parts.py on every
real fixture).

Three keys, from the loosest to the strictest, each checked by the analysis itself:
- the SQL (map_done, 05_mapped.sql): what needs the rank's events alone, whatever the job and the
  options (the optimizer's launches, the CUDA calls' counts, busiest thread and allocator calls);
- the steps (ops_mapped, 14_gpu_ops.sql): what needs the rank's events and its steps (the GPU ops
  per step that the window is made of, the NCCL kernels the collectives are matched from, the
  compute launched between steps). For these ranks `gpu_ops` holds the NCCL kernels only, and
  every file that needs more of their ops takes the map's rows or, outside map_ranks, waits for
  22_gpu_ops_rest.sql to add them;
- the scopes (map_ranks): the window statistics.
With the three, the report reads a mapped rank's CUDA calls, kernels, copies, memsets and
OS-runtime calls only for the ranks it draws in the timeline, and the reduce leaves them in the
parts (store/views.py, IF_MAPPED). Its NVTX ranges are still read (steps, NCCL's byte counts,
the stages, where a stopped rank ended), and its compute islands by the critical path.

The small tables travel stacked in one part per rank (STACK), the compute islands in their own.

The tables' columns are declared here, as the event tables' are in store/schema.py, so a
store without them (the in-process ingest, an older store) gets them empty and the SQL binds.
A change to them changes what a map writes: bump collect/parts.MAP_VERSION with it, so that
parts of the old shape are mapped again instead of misread.
"""

from __future__ import annotations

from dataclasses import dataclass

import duckdb

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


_I, _B, _D, _V = "INTEGER", "BIGINT", "DOUBLE", "VARCHAR"

SUMMARIES = (
    # The key (21_stats_scope.sql, rank_scope): in the map's one-rank store the rank's clock
    # offset is 0, so its times are on the rank's own clock; the analysis adds the store's.
    Summary("map_scope", "rank_scope",
            (("rank", _I), ("s", _B), ("e", _B), ("n_steps", _B), ("gs", _B), ("ge", _B), ("pid", _B),
             ("sql", _V))),
    Summary("map_phase_rows", "phase_rows",
            (("rank", _I), ("grp", _V), ("n", _B), ("total_ns", _B), ("mean_ns", _D), ("med_ns", _D),
             ("min_ns", _B), ("max_ns", _B), ("std_ns", _D), ("n_steps", _B), ("per_step_ns", _D), ("gpu_ns", _B),
             ("gpu_per_step_ns", _D), ("gpu_ops", _B), ("gpu_span_ns", _B))),
    Summary("map_api_table", "api_table",
            (("rank", _I), ("api", _V), ("name", _V), ("tid", _B), ("thread", _V), ("role", _V), ("n", _B),
             ("total_ns", _B), ("mean_ns", _D), ("med_ns", _D), ("min_ns", _B), ("max_ns", _B), ("std_ns", _D),
             ("n_steps", _B), ("per_step_ns", _D), ("pct", _D))),
    Summary("map_thread_table", "thread_table",
            (("rank", _I), ("tid", _B), ("thread", _V), ("role", _V), ("span_ns", _B), ("launch_ns", _B),
             ("sync_ns", _B), ("wait_ns", _B), ("blocked_ns", _B), ("n_steps", _B), ("top_wait", _V),
             ("blocked_per_step_ns", _D), ("blocked_pct", _D), ("launch_pct", _D))),
    Summary("map_sync_copies", "sync_copies",
            (("rank", _I), ("what", _V), ("n", _B), ("api_ns", _B), ("gpu_ns", _B), ("bytes", _B), ("n_steps", _B),
             ("top_api", _V))),
    Summary("map_sync_api_calls", "sync_api_calls",
            (("rank", _I), ("name", _V), ("n", _B), ("ns", _B), ("max_ns", _B), ("n_steps", _B))),
    # Slice bounds on the rank's own clock, shifted by the analysis.
    Summary("map_gpu_slices", "gpu_slices",
            (("rank", _I), ("slice", _B), ("s", _B), ("e", _B), ("busy_ns", _B), ("util_pct", _D))),
    # The GPU's compute intervals (what the critical path reads across ranks), on the rank's own
    # clock, with their running total (upto); then each class's time in the window.
    Summary("map_compute_islands", "compute_islands", (("rank", _I), ("s", _B), ("e", _B), ("upto", _B)), own=True),
    Summary("map_gpu_time", "gpu_time",
            (("rank", _I), ("compute_ns", _B), ("comm_ns", _B), ("busy_ns", _B), ("p2p_ns", _B),
             ("overlap_ns", _B))),
    # The GPU's idle gaps of at least --gap-ms with the CPU range that explains each (the map's
    # threshold is in its scope key), on the rank's own clock.
    Summary("map_gap_attr", "gap_attr",
            (("rank", _I), ("s", _B), ("e", _B), ("dur", _B), ("range_group", _V), ("range_text", _V))),
    Summary("map_between_steps", "between_steps", (("rank", _I), ("s", _B), ("e", _B), ("other_work", "BOOLEAN"))),
    # What the gaps are made of (40_gaps.sql, 45_cpu_state.sql, 99_slice_idle.sql): the short ones,
    # the OS calls the loop thread was in during the long ones and the Python functions it ran,
    # the idle of each slice.
    Summary("map_small_gaps", "small_gaps", (("rank", _I), ("n", _B), ("ns", _B))),
    Summary("map_alloc_gaps", "alloc_gaps", (("rank", _I), ("n", _B), ("ns", _B), ("small_n", _B), ("small_ns", _B))),
    Summary("map_osrt_traced", "osrt_traced", (("rank", _I),)),
    Summary("map_gap_cpu", "gap_cpu", (("rank", _I), ("range_group", _V), ("call", _V), ("ns", _B))),
    Summary("map_gap_python", "gap_python",
            (("rank", _I), ("range_group", _V), ("func", _V), ("leaf", _V), ("n", _B))),
    Summary("map_slice_idle", "slice_idle", (("rank", _I), ("slice", _B), ("short_ns", _B), ("long_ns", _B))),
    # Host syncs and the GPU idle after each, on the rank's own clock; their per-rank totals.
    Summary("map_host_syncs", "host_syncs",
            (("rank", _I), ("tid", _B), ("start", _B), ("end", _B), ("name", _V), ("step", _B))),
    Summary("map_sync_idle", "sync_idle",
            (("rank", _I), ("start", _B), ("end", _B), ("tid", _B), ("idle_ns", _B))),
    # Where the CPU blocked on its GPU (56_cpu_blocks.sql): the replay's bounds on its launches.
    Summary("map_cpu_blocks", "cpu_blocks",
            (("rank", _I), ("start", _B), ("end", _B), ("sync", "BOOLEAN"), ("done", _B), ("lb", _B))),
    Summary("map_queue_wait", "queue_wait", (("rank", _I), ("launch", _B), ("cum", _B))),
    Summary("map_sync_stats", "sync_stats",
            (("rank", _I), ("n_syncs", _B), ("n_steps", _B), ("sync_per_step", _D), ("blocked_ns", _B),
             ("idle_after_ns", _B), ("idle_after_ns_per_step", _D), ("top_name", _V), ("names", _V))),
    # What derives from the rank's own events and steps alone (05_mapped.sql, 14_gpu_ops.sql):
    # taken wherever the map ran this SQL (the optimizer's launches) and its steps are the
    # report's (the GPU ops per step, the NCCL kernels, the compute between steps), whatever
    # the options; on the rank's own clock.
    Summary("map_opt_launch", "opt_launch", (("rank", _I), ("start", _B))),
    Summary("map_steps", "steps",
            (("rank", _I), ("tid", _B), ("start", _B), ("end", _B), ("step", _I), ("family", _I))),
    Summary("map_step_ops", "step_ops", (("rank", _I), ("step", _I), ("n", _B), ("s", _B), ("e", _B))),
    Summary("map_comm_ops", "comm_ops",
            (("rank", _I), ("kind", _V), ("is_comm", "BOOLEAN"), ("start", _B), ("end", _B), ("correlation_id", _B),
             ("name", _V), ("step", _I), ("tid", _B), ("launch", _B), ("graph", "BOOLEAN"))),
    Summary("map_offstep", "offstep_islands", (("rank", _I), ("s", _B), ("e", _B))),
    # The rank's CUDA calls, counted and picked (11_cuda_calls.sql): taken wherever the map ran
    # this SQL, so that the calls themselves stay in the parts.
    Summary("map_cuda_calls", "cuda_calls", (("rank", _I), ("calls", _B), ("launches", _B))),
    Summary("map_busy_thread", "busy_thread", (("rank", _I), ("tid", _B))),
    Summary("map_alloc_api", "alloc_api", (("rank", _I), ("start", _B), ("end", _B), ("base", _V))),
    Summary("map_rank_device", "rank_device", (("rank", _I), ("device", _I))),
    # Window statistics (map_ranks, as above): the CUDA calls in the window, the copies', the
    # kernels' and memory operations' tables, the CUDA graphs'.
    Summary("map_capture_api", "capture_api", (("rank", _I), ("api_calls", _B), ("launches", _B))),
    Summary("map_kernel_stats", "kernel_stats", (("rank", _I), ("n", _B), ("median_ns", _D), ("n_steps", _B))),
    Summary("map_memcpy_window", "memcpy_window",
            (("rank", _I), ("kind", _V), ("src_kind", _V), ("n", _B), ("bytes", _B), ("ns", _B))),
    Summary("map_mem_rows", "mem_rows",
            (("rank", _I), ("op", _V), ("host_kind", _V), ("n", _B), ("total_ns", _B), ("mean_ns", _D), ("med_ns", _D),
             ("min_ns", _B), ("max_ns", _B), ("std_ns", _D), ("bytes", _B), ("mean_bytes", _D), ("med_bytes", _D),
             ("min_bytes", _B), ("max_bytes", _B), ("n_steps", _B), ("per_step_ns", _D), ("is_total", _B))),
    Summary("map_kernel_rows", "kernel_rows",
            (("rank", _I), ("name", _V), ("short_name", _V), ("cls", _V), ("origin", _V), ("n", _B), ("total_ns", _B),
             ("mean_ns", _D), ("med_ns", _D), ("min_ns", _B), ("max_ns", _B), ("std_ns", _D), ("n_steps", _B),
             ("per_step_ns", _D))),
    Summary("map_graph_usage", "graph_usage",
            (("rank", _I), ("replays", _B), ("n_steps", _B), ("graph_level", "BOOLEAN"), ("graph_busy_ns", _B),
             ("busy_ns", _B), ("graph_share_pct", _D), ("eager_kernels", _B), ("eager_kernel_ns", _B),
             ("top_eager", _V), ("between_ns", _B), ("launch_ns", _B), ("sync_ns", _B), ("copy_ns", _B),
             ("other_api_ns", _B), ("python_ns", _B))),
)
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
    return [("tbl", _V), ("rank", _I), *((f"{k}_{i}", k) for k, n in need.items() for i in range(n))]


def stacked_select() -> str:
    """Every small table's rows as the stacked part's rows (what the map writes)."""
    body = " UNION ALL BY NAME ".join(f"({s.stacked()})" for s in SUMMARIES if not s.own)
    cols = ", ".join(f'CAST("{c}" AS {t}) AS "{c}"' for c, t in stack_columns())
    return f"SELECT {cols} FROM ({body})"


# The analysis files whose tables the map computes (and, through their dependencies, the
# steps, window and scope they are measured in).
SQL_FILES = ("13_rank_device.sql", "30_intervals.sql", "40_gaps.sql", "45_cpu_state.sql", "55_host_sync.sql",
             "56_cpu_blocks.sql", "66_cuda_graphs.sql", "67_capture_overhead.sql", "90_gpu_work.sql", "92_phases.sql",
             "94_kernel_table.sql", "96_memory_ops.sql", "98_api_osrt.sql", "99_nsys_rules.sql", "99_slice_idle.sql")


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
