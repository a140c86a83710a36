"""Small synthetic inputs for rule unit tests: a Report with the given ranks and stages, and
analysis views as in-memory DuckDB tables, so each rule runs in milliseconds without a store."""

from __future__ import annotations

from typing import Any

import duckdb
import pyarrow as pa

from orchestrator.analyze.model_report import Finding, RankMetrics, Report, Window
from orchestrator.analyze.rules import registry
from orchestrator.analyze.rules.base import Context
from orchestrator.metrics.engine import Options, Views


def rank(rank: int, **kw: Any) -> RankMetrics:
    base: dict[str, Any] = dict(rank=rank, status="ok", window_ms=100.0, compute_ms=90.0, comm_ms=0.0,
                                overlap_ms=0.0, comm_overlap_pct=0.0, exposed_comm_ms=0.0, gpu_busy_ms=98.0,
                                gpu_idle_pct=2.0, p2p_ms=0.0, nccl_wait_ms=0.0, late_count=0, collectives=0,
                                gaps_by_range_ms={}, top_gaps=[], step_ms=[])
    base.update(kw)
    return RankMetrics(**base)


def context(ranks: list[RankMetrics], tables: dict[str, list[dict[str, Any]]] | None = None,
            opts: Options | None = None, findings: list[Finding] | None = None, **report: Any) -> Context:
    con = duckdb.connect()
    # Every view a rule reads is empty unless the test gives its rows (most captures have no
    # Python samples, no allocator gaps, ...).
    for name, rows in {**{v: [] for r in registry() for v in r.reads}, **(tables or {})}.items():
        # An empty view still has a column: DuckDB registers no table without one.
        con.register(name, pa.Table.from_pylist(rows) if rows else pa.table({"rank": pa.array([], pa.int64())}))
    fields: dict[str, Any] = dict(
        orch_version="test", store="mem", layout={"known": False}, ranks=ranks, steps=[], stages=[],
        imbalance=None, stragglers=[], missing_ranks=[], problems=[], cpu_phases=[], gpu_activity=True,
        window=Window(source=["steps"], steps=None, gap_ms=1.0, note="", per_rank={}))
    fields.update(report)
    return Context(views=Views(con), report=Report(**fields), opts=opts or Options(), findings=list(findings or []))
