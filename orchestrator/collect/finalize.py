"""The store's last step, the same whichever writer put the event rows in (the in-process
ingest or the reduce of Parquet parts): the small tables (ranks, env, sources) from the
identified members, impossible rows counted on their rank and deleted, then finalize.sql.
One function for both, so both give the same store.
"""

from __future__ import annotations

import duckdb

from orchestrator import numbers
from orchestrator.collect.identity import Layout, Member
from orchestrator.collect.probe import ENV_ALLOW
from orchestrator.collect.store import append_rows
from orchestrator.store.schema import finalize_sql, negative_durations_sql
from orchestrator.timings import phase

_RANK_COLS = ("rank", "host", "pid", "local_rank", "node", "stage", "dp_index", "tp_index", "gpu_name",
              "session_start_utc_ns", "clock_offset_ns", "clock_correction_ns", "nsys_version", "schema_version",
              "source_file", "identity_source", "status", "error", "untraced")


def _count_impossible(con: duckdb.DuckDBPyConnection, members: list[Member], unfiltered: dict[str, str | None],
                      known: list[tuple[int, str, int]]) -> set[str]:
    """Rows that end before they start are deleted at finalize; count them on their rank
    first (`known`: counts made by the maps, for the tables `unfiltered` maps to None).
    Returns the tables that hold any (the only ones the delete has to scan)."""
    by_rank = {m.rank: m for m in members if m.rank is not None and m.status == "ok" and not m.probe.error}
    per: dict[int, list[str]] = {}
    tables: set[str] = set()
    counted = con.execute(negative_durations_sql(unfiltered)).fetchall()
    for rank, table, n in sorted([*counted, *known]):
        per.setdefault(rank, []).append(f"{n} {table}")
        tables.add(table)
    for rank, what in per.items():
        if rank in by_rank:
            by_rank[rank].probe.notes.append(f"dropped rows that end before they start: {', '.join(what)}")
    return tables


def _local_rank(m: Member, layout: Layout) -> int | None:
    local, bad = numbers.optional(numbers.rank, m.probe.env.get("LOCAL_RANK"), "LOCAL_RANK")
    if bad:
        m.probe.notes.append(f"captured {bad}: ignored")
    if local is not None:
        return local
    return m.rank % layout.nproc_per_node if (layout.nproc_per_node and m.rank is not None) else None


def finalize_store(con: duckdb.DuckDBPyConnection, members: list[Member], base: int, layout: Layout,
                   keep_env: bool, expected: list[int] | None, unfiltered: dict[str, str | None] | None = None,
                   known: list[tuple[int, str, int]] | None = None) -> set[str]:
    """The small tables (ranks, env, sources) from the members, and the event tables, which
    hold every ingested row, finished in place: impossible rows counted on their rank, then
    deleted; then finalize.sql. `unfiltered`: for an event table that is a view over the parts
    (it leaves those rows out itself), the relation with all its rows, where they are counted,
    or None where the maps counted them (`known`: (rank, table, n)). Returns the tables that
    held such rows."""
    unfiltered = unfiltered or {}
    with phase("finalize: count impossible rows"):
        impossible = _count_impossible(con, members, unfiltered, known or [])
    rows, env_rows, src_rows = [], [], []
    seen: set[int] = set()
    for m in members:
        p, r = m.probe, m.report
        reason = p.error or "; ".join(m.notes) or None
        src_rows.append((str(r.origin), m.rank, "error" if p.error else m.status, reason))
        if m.rank is None or m.status == "duplicate":
            continue
        seen.add(m.rank)
        place = layout.place(m.rank)
        local = _local_rank(m, layout)
        status = "error" if (p.error or m.status == "error") else ("partial" if p.notes else "ok")
        rows.append((
            m.rank, r.host or p.host, r.pid or p.pid, local,
            place["node"], place["stage"], place["dp_index"], place["tp_index"], p.gpu_name,
            p.session_start_ns, (p.session_start_ns - base) if p.session_start_ns is not None else None,
            0, p.nsys_version, p.schema_version, str(r.origin), m.source or None, status,
            "; ".join(dict.fromkeys(x for x in [p.error, *m.notes, *p.notes] if x)) or None,
            ",".join(p.untraced) if not p.error else None,
        ))
        for k, v in p.env.items():
            if keep_env or ENV_ALLOW.match(k):
                env_rows.append((m.rank, k, v))
    for rank in sorted(set(expected or []) - seen):
        place = layout.place(rank)
        rows.append((rank, None, None, None, place["node"], place["stage"], place["dp_index"],
                     place["tp_index"], None, None, None, None, None, None, None, None, "missing",
                     "no report found for this rank", None))
    with phase("finalize: ranks/env/sources"):
        append_rows(con, "ranks", _RANK_COLS, rows)
        append_rows(con, "env", ("rank", "name", "value"), env_rows)
        append_rows(con, "sources", ("file", "rank", "status", "reason"), src_rows)
    # Hosts fill `node` when no layout says nproc_per_node (one node per distinct host).
    con.execute("""UPDATE ranks SET node = h.n FROM (SELECT host, dense_rank() OVER (ORDER BY host) - 1 AS n
                   FROM (SELECT DISTINCT host FROM ranks WHERE host IS NOT NULL)) h
                   WHERE ranks.node IS NULL AND ranks.host = h.host""")
    with phase("finalize: delete impossible rows, finalize.sql"):
        con.execute(finalize_sql(impossible - set(unfiltered)))
    return impossible
