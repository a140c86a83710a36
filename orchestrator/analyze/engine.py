"""Run the analysis SQL over a merged store and return small per-rank/per-stage tables.

All row-level work (interval unions, gap attribution, collective matching) is SQL in
`analyze/sql/NN_*.sql`, executed in order in an in-memory DuckDB that attaches the store
read-only. Python only sees the aggregated results (a few rows per rank).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb

from orchestrator.collect.ingest import sql_literal
from orchestrator.errors import OrchError

SQL_DIR = resources.files("orchestrator.analyze") / "sql"


@dataclass(frozen=True)
class Options:
    gap_ms: float = 1.0
    steps: tuple[int, int] | None = None  # inclusive step numbers; None = all but the first
    top_gaps: int = 10


def parse_steps(text: str | None) -> tuple[int, int] | None:
    if not text:
        return None
    lo, sep, hi = text.partition(":")
    try:
        a, b = int(lo), int(hi if sep else lo)
    except ValueError:
        raise OrchError(f"--steps {text!r}: use A:B with step numbers, e.g. --steps 3:8") from None
    if a > b or a < 0:
        raise OrchError(f"--steps {text!r}: A must be <= B and >= 0")
    return a, b


def open_store(store: Path) -> duckdb.DuckDBPyConnection:
    if not store.is_file():
        raise OrchError(f"{store} does not exist; run `orch collect` first")
    con = duckdb.connect()
    try:
        con.execute(f"ATTACH '{sql_literal(str(store))}' AS store (READ_ONLY)")
    except duckdb.Error as e:
        con.close()
        reason = str(e).splitlines()[0]
        raise OrchError(f"{store} is not a readable orch store ({reason}); re-run `orch collect`") from None
    con.execute("USE store")
    return con


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None) -> list[dict[str, Any]]:
    cur = con.execute(sql, params or [])
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r, strict=False)) for r in cur.fetchall()]


def run_sql(con: duckdb.DuckDBPyConnection, opts: Options) -> None:
    lo, hi = opts.steps if opts.steps else (None, None)
    con.execute("CREATE OR REPLACE TEMP TABLE params AS SELECT CAST(? AS BIGINT) AS gap_ns, "
                "CAST(? AS INTEGER) AS step_lo, CAST(? AS INTEGER) AS step_hi",
                [int(opts.gap_ms * 1e6), lo, hi])
    for f in sorted(p for p in SQL_DIR.iterdir() if p.name.endswith(".sql")):
        con.execute(f.read_text())


def query(store: Path, opts: Options) -> dict[str, Any]:
    """Everything the report needs, as plain Python values (ns unless named _ms/_pct)."""
    con = open_store(store)
    try:
        run_sql(con, opts)
        meta = {r["key"]: r["value"] for r in _rows(con, "SELECT key, value FROM meta")}
        return {
            "meta": meta,
            "layout": json.loads(meta.get("layout", "{}")),
            "ranks": _rows(con, """
                SELECT r.rank, r.host, r.stage, r.status, r.error, r.gpu_name, r.node,
                       m.window_ns, m.w0, m.w1, m.source AS window_source, m.compute_ns, m.comm_ns,
                       m.overlap_ns, m.busy_ns, m.p2p_ns, c.nccl_wait_ns, c.late_count, c.n_coll,
                       c.wait_caused_ns, c.group_size, c.median_lateness_ns
                FROM ranks r LEFT JOIN rank_metrics m USING (rank) LEFT JOIN coll_rank c USING (rank)
                ORDER BY r.rank"""),
            "gaps_by_range": _rows(con, """
                SELECT rank, range_group, sum(dur) AS ns, count(*) AS n
                FROM gap_attr GROUP BY ALL ORDER BY rank, ns DESC, range_group"""),
            "top_gaps": _rows(con, """
                SELECT rank, s, e, dur, range_group, range_text FROM (
                    SELECT *, row_number() OVER (PARTITION BY rank ORDER BY dur DESC, s) AS i FROM gap_attr)
                WHERE i <= ? ORDER BY rank, dur DESC, s""", [opts.top_gaps]),
            "steps": _rows(con, """
                SELECT s.rank, s.step, s.ns, (s.step = f.first_step) AS warmup
                FROM step_gpu s JOIN first_step f USING (rank) ORDER BY s.step, s.rank"""),
            "cpu_phases": _rows(con, "SELECT * FROM cpu_phases ORDER BY grp, rank"),
            "has_steps": con.execute("SELECT count(*) > 0 FROM steps").fetchone()[0],
            "memcpy": _rows(con, """
                SELECT m.rank, m.kind, m.src_kind, count(*) AS n, sum(m.bytes) AS bytes,
                       sum(least(m."end", w.w1) - greatest(m.start, w.w0)) AS ns
                FROM memcpy m JOIN win w USING (rank)
                WHERE m."end" > w.w0 AND m.start < w.w1 GROUP BY ALL ORDER BY ALL"""),
            "kernel_stats": _rows(con, """
                SELECT o.rank, count(*) AS n, median(o."end" - o.start) AS median_ns,
                       count(DISTINCT o.step) AS n_steps
                FROM gpu_ops o JOIN win w USING (rank)
                WHERE o.kind = 'kernel' AND o.start >= w.w0 AND o."end" <= w.w1 GROUP BY o.rank ORDER BY o.rank"""),
            "small_gaps": _rows(con, """
                WITH b AS (SELECT rank, e, lead(s) OVER (PARTITION BY rank ORDER BY s) AS nx
                           FROM islands WHERE cls = 'busy')
                SELECT rank, count(*) AS n, sum(nx - e) AS ns FROM b, params p
                WHERE nx IS NOT NULL AND nx - e < p.gap_ns GROUP BY rank ORDER BY rank"""),
            "straggler_context": _rows(con, """
                -- While the others waited for a late rank: its GPU gaps there, by CPU range.
                SELECT w.rank, g.range_group, sum(least(g.e, w.e) - greatest(g.s, w.s)) AS ns
                FROM late_windows w JOIN gap_attr g ON g.rank = w.rank AND g.s < w.e AND g.e > w.s
                GROUP BY ALL ORDER BY w.rank, ns DESC, g.range_group"""),
            "late_busy": _rows(con, """
                -- How long those waits were in total, and how much of it the late GPU was busy.
                SELECT w.rank, any_value(t.ns) AS wait_ns,
                       coalesce(sum(least(i.e, w.e) - greatest(i.s, w.s)), 0) AS busy_ns
                FROM late_windows w
                JOIN (SELECT rank, sum(e - s) AS ns FROM late_windows GROUP BY rank) t USING (rank)
                LEFT JOIN islands i ON i.rank = w.rank AND i.cls = 'busy' AND i.s < w.e AND i.e > w.s
                GROUP BY w.rank ORDER BY w.rank"""),
        }
    except duckdb.Error as e:
        raise OrchError(f"analysis failed on {store}: {str(e).splitlines()[0]}; "
                        "re-run `orch collect` to rebuild the store") from None
    finally:
        con.close()
