"""The store's event tables, ONE home: per table its nsys source table, its columns and types,
where each column comes from, and which columns sit on the shared clock.

Everything else is generated from `TABLES`: the DDL and Arrow schema (schema.py), the probe's
list of source tables and expected columns (probe.py), the SELECT per rank (extract.py), the
removal of impossible rows (end < start) and the clock alignment (schema.py). Adding a
column or a table is one edit here (plus a special builder only when the SELECT is not a
plain per-row mapping, as for NVTX depth).

Column `how`:
- `raw`: the first present source column of `src` (alternatives, older names last);
- `time`: a timestamp, shifted onto the shared clock (+ the rank's offset) and by alignment;
- `string`: a StringIds id, replaced by its text (NULL when StringIds is missing);
- `text_or_string`: plain text in src[0], else the StringIds text of src[1] (NVTX);
- `enum`: an integer mapped through `enum` (CUPTI enums are stable; the ENUM_* tables are
  not always exported), `'unknown'` for other values;
- `expr`: `expr` over the source row `x` (common SQLite/DuckDB dialect), when all `src` exist;
- `builder`: filled by the table's special builder in extract.py.
Classification (comm vs compute) is NOT stored: analysis derives it from names, so changing
it never needs a new collect.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

# 2: kernels.category dropped; osrt, threads, sync added; ranks.untraced
# 3: gpu_memory, gpu_info, graph_execs added (the analysis reads them: a v2 store is re-collected)
# 4: profiler_overhead added (the capture-overhead estimate reads it)
STORE_VERSION = 4

# OS runtime calls shorter than this are not stored: a training process makes tens of
# thousands of microsecond calls (non-blocking accept/stat/ioctl polls) that would double the
# ingest, while the waits that matter (pthread_cond_wait, poll, read for a batch) are long.
# nsys itself drops calls under 1 us. ORCH_OSRT_MIN_NS=0 keeps every call.
_OSRT_ENV = os.environ.get("ORCH_OSRT_MIN_NS", "").strip()
OSRT_MIN_NS = int(_OSRT_ENV) if _OSRT_ENV.isascii() and _OSRT_ENV.isdigit() and len(_OSRT_ENV) < 16 else 10_000

# CUPTI enums.
COPY_KIND = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA",
             8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "UVM HtoD", 12: "UVM DtoH", 13: "UVM DtoD"}
MEM_KIND = {0: "pageable", 1: "pinned", 2: "device", 3: "array", 4: "managed",
            5: "device static", 6: "managed static"}
MEM_OP = {0: "alloc", 1: "free"}  # ENUM_CUDA_DEV_MEM_EVENT_OPER
SYNC_TYPE = {0: "unknown", 1: "event_synchronize", 2: "stream_wait_event", 3: "stream_synchronize",
             4: "context_synchronize"}


@dataclass(frozen=True)
class Col:
    name: str
    type: str  # DuckDB type
    src: tuple[str, ...] = ()
    how: str = "raw"
    enum: Mapping[int, str] | None = None
    expr: str = ""
    doc: str = ""
    optional: bool = False  # absent in older exports as a matter of course: no missing-column note


@dataclass(frozen=True)
class Table:
    name: str
    source: str  # the nsys table
    columns: tuple[Col, ...]
    doc: str
    # A missing source table is a note on the rank ("partial"). False where its absence is no
    # loss: a trace option was off, or nsys writes no table for a kind with no events (a loop
    # with no NVTX ranges, no copies or no memsets is whole).
    noted: bool = True
    builder: str = "plain"  # plain | nvtx | gpu_metrics | threads
    # The FROM item for the source, when it is not the table itself ({s}: schema prefix).
    from_sql: str = ""
    extra_expected: tuple[str, ...] = field(default=())  # source columns the builder needs
    where: str = ""  # row filter over the source row `x` (rows that end before they start always pass,
    # so that finalize counts them)

    @property
    def store_columns(self) -> list[tuple[str, str]]:
        return [("rank", "INTEGER")] + [(c.name, c.type) for c in self.columns]

    @property
    def shifted(self) -> list[str]:
        """Columns on the shared clock: moved by the rank offset and by --align-clocks."""
        return [c.name for c in self.columns if c.how == "time"]

    @property
    def has_duration(self) -> bool:
        return {"start", "end"} <= set(self.shifted)

    @property
    def expected(self) -> list[tuple[str, ...]]:
        """Source columns (alternatives grouped) a present source table should have."""
        groups = [c.src for c in self.columns if c.src and c.how != "expr" and not c.optional]
        groups += [c.src for c in self.columns if c.how == "expr"]
        return groups + [(x,) for x in self.extra_expected]


def _t(name: str, src: str) -> Col:
    return Col(name, "BIGINT", (src,), "time")


_DEV = (Col("device", "INTEGER", ("deviceId",)), Col("stream", "BIGINT", ("streamId",)),
        Col("correlation_id", "BIGINT", ("correlationId",)))

TABLES: dict[str, Table] = {t.name: t for t in (
    Table("kernels", "CUPTI_ACTIVITY_KIND_KERNEL", (
        _t("start", "start"), _t("end", "end"), *_DEV,
        Col("short_name", "VARCHAR", ("shortName",), "string"),
        Col("name", "VARCHAR", ("demangledName",), "string"),
    ), "GPU kernels; NCCL kernels are those whose short_name starts with `nccl`"),
    Table("memcpy", "CUPTI_ACTIVITY_KIND_MEMCPY", (
        _t("start", "start"), _t("end", "end"), *_DEV,
        Col("kind", "VARCHAR", ("copyKind",), "enum", COPY_KIND),
        Col("bytes", "BIGINT", ("bytes",)),
        Col("src_kind", "VARCHAR", ("srcKind",), "enum", MEM_KIND),
        Col("dst_kind", "VARCHAR", ("dstKind",), "enum", MEM_KIND),
    ), "memory copies", noted=False),
    Table("memset", "CUPTI_ACTIVITY_KIND_MEMSET", (
        _t("start", "start"), _t("end", "end"), *_DEV, Col("bytes", "BIGINT", ("bytes",)),
    ), "memsets", noted=False),
    Table("cuda_api", "CUPTI_ACTIVITY_KIND_RUNTIME", (
        _t("start", "start"), _t("end", "end"), Col("tid", "BIGINT", ("globalTid",)),
        Col("correlation_id", "BIGINT", ("correlationId",)),
        Col("name", "VARCHAR", ("nameId",), "string"),
    ), "CUDA runtime calls (cudaLaunchKernel, cudaStreamSynchronize, ...)"),
    Table("nvtx", "NVTX_EVENTS", (
        _t("start", "start"), _t("end", "end"), Col("tid", "BIGINT", ("globalTid",)),
        Col("domain_id", "BIGINT", ("domainId",), "builder"),
        Col("domain", "VARCHAR", (), "builder"),
        Col("text", "VARCHAR", ("text", "textId"), "text_or_string"),
        Col("depth", "INTEGER", (), "builder"),
        # NVTX extended payloads as JSON (nsys >= 2024 exports them with --include-json):
        # NCCL's own ranges carry {"Message size [bytes]": N, ...}, the bytes per collective.
        Col("payload", "VARCHAR", ("jsonText", "jsonTextId"), "text_or_string", optional=True),
    ), "NVTX push/pop and start/end ranges with their nesting depth per (thread, domain) and payload",
        builder="nvtx", extra_expected=("eventType",), noted=False),
    Table("gpu_metrics", "GPU_METRICS", (
        _t("start", "timestamp"),
        Col("gpu", "INTEGER", ("typeId",), "expr", expr="CAST(x.typeId % 256 AS INTEGER)"),
        Col("metric", "VARCHAR", (), "builder"),
        Col("value", "BIGINT", ("value",)),
    ), "GPU metrics samples, long format", noted=False, builder="gpu_metrics",
        extra_expected=("metricId",)),
    Table("osrt", "OSRT_API", (
        _t("start", "start"), _t("end", "end"), Col("tid", "BIGINT", ("globalTid",)),
        Col("name", "VARCHAR", ("nameId",), "string"),
        Col("return_value", "BIGINT", ("returnValue",)),
    ), "OS runtime calls (pthread_cond_wait, poll, read, ...) of at least OSRT_MIN_NS, when traced (-t osrt)",
        noted=False, where=f'x."end" - x."start" >= {OSRT_MIN_NS} OR x."end" < x."start"'),
    Table("threads", "ThreadNames", (
        Col("tid", "BIGINT", ("globalTid",)),
        Col("pid", "BIGINT", ("globalTid",), "expr", expr="(x.globalTid >> 24) & 16777215"),
        Col("os_tid", "BIGINT", ("globalTid",), "expr", expr="x.globalTid & 16777215"),
        Col("name", "VARCHAR", ("nameId",), "string"),
        Col("process", "VARCHAR", (), "builder"),
    ), "thread names (one row per thread) and their process names", noted=False, builder="threads",
        # One row per thread: a renamed thread keeps its latest name (the higher string id).
        from_sql="(SELECT globalTid, max(nameId) AS nameId FROM {s}ThreadNames GROUP BY globalTid)"),
    Table("sync", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", (
        _t("start", "start"), _t("end", "end"), *_DEV,
        Col("sync_type", "VARCHAR", ("syncType", "deprecatedSyncType"), "enum", SYNC_TYPE),
    ), "CUDA synchronizations; the calling thread is cuda_api.tid of the same correlation_id",
        noted=False),
    # Only with `nsys profile --cuda-memory-usage=true`: one row per allocation or free of
    # GPU memory (cudaMalloc, the caching allocator's segments, cudaMallocAsync pools).
    Table("gpu_memory", "CUDA_GPU_MEMORY_USAGE_EVENTS", (
        _t("start", "start"), Col("device", "INTEGER", ("deviceId",)),
        Col("op", "VARCHAR", ("memoryOperationType",), "enum", MEM_OP),
        Col("mem_kind", "VARCHAR", ("memKind",), "enum", MEM_KIND),
        Col("bytes", "BIGINT", ("bytes",)), Col("address", "BIGINT", ("address",)),
    ), "GPU memory allocations and frees (--cuda-memory-usage=true)", noted=False),
    # CUDA graph replays as one row each (nsys --cuda-graph-trace=graph, its default): the
    # graph's kernels then have no rows of their own, so this is GPU work like a kernel's.
    # correlation_id is the launching cudaGraphLaunch's (with node tracing the kernels carry it).
    Table("graph_execs", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE", (
        _t("start", "start"), _t("end", "end"), *_DEV,
        Col("graph_id", "BIGINT", ("graphId",)), Col("graph_exec_id", "BIGINT", ("graphExecId",)),
    ), "CUDA graph executions (graph-level tracing: one row per replay)", noted=False),
    # nsys's own work inside the process (CUPTI buffer flushes, instrumentation, injection
    # at dlopen): time the capture added that no traced call shows. Absent in older exports.
    Table("profiler_overhead", "PROFILER_OVERHEAD", (
        _t("start", "start"), _t("end", "end"), Col("tid", "BIGINT", ("globalTid",)),
        Col("name", "VARCHAR", ("nameId",), "string"),
    ), "nsys's own overhead ranges (CUPTI buffer flushes, instrumentation)", noted=False),
    # Every GPU of the node (not only the rank's): the rank's is the device its work ran on.
    Table("gpu_info", "TARGET_INFO_GPU", (
        Col("device", "INTEGER", ("id",)), Col("name", "VARCHAR", ("name",)),
        Col("total_memory", "BIGINT", ("totalMemory",)),
    ), "the node's GPUs and their memory capacity in bytes", noted=False),
)}

# Source tables of the event tables, by store table (the probe's list).
EVENT_TABLES: dict[str, str] = {t.name: t.source for t in TABLES.values()}

# The other export tables collect reads: names (StringIds), the probe's identity and clock
# (probe.py: META_DATA_*, TARGET_INFO_*, PROCESSES), GPU metric names (extract.py).
# EXPORT_META_DATA is META_DATA_EXPORT's older name.
OTHER_SOURCES = ("StringIds", "PROCESSES", "META_DATA_CAPTURE", "META_DATA_EXPORT", "EXPORT_META_DATA",
                 "TARGET_INFO_SESSION_START_TIME", "TARGET_INFO_SYSTEM_ENV", "TARGET_INFO_GPU",
                 "TARGET_INFO_GPU_METRICS")


def export_tables() -> list[str]:
    """Every table orch reads from an export: what `nsys export --tables` is asked for (the
    other tables, 30 % of a GPT-2 export, cost export time and are never read)."""
    return sorted({t.source for t in TABLES.values()} | set(OTHER_SOURCES))
