"""`orch export-trace`: all ranks as one timeline, one process per rank, for Perfetto or Chrome.

Two formats, chosen by the output's suffix: Perfetto's protobuf (`.pftrace`, `.perfetto-trace`,
`.pb`: what ui.perfetto.dev and trace_processor read natively, smaller than the JSON and with
no 1 GB string limit) and the Chrome JSON trace (`.json`, which viewers refuse past ~1 GB).
Both are written by DuckDB: one row per slice or packet, streamed to the file in chunks, so a
store of thousands of ranks never sits in Python memory. Only names and times leave the store:
no captured environment is written.

Past `max_events`, the ranks that explain the run are kept (those the findings blame, their
victims, the median rank, rank 0) and the trace says which were left out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from orchestrator.analyze.rank_pick import pick_ranks
from orchestrator.errors import OrchError
from orchestrator.export import perfetto
from orchestrator.metrics.engine import attach_store, check_store_version
from orchestrator.sqltext import execute

if TYPE_CHECKING:
    import duckdb

PROTO_SUFFIXES = (".pftrace", ".perfetto-trace", ".pb")
# Events (slices) per format past which ranks are dropped: ~130 bytes a JSON event keeps the
# file under ~0.7 GB; a protobuf slice (two packets) is ~60 bytes, ~1.2 GB at 20M.
DEFAULT_MAX_EVENTS = {"json": 5_000_000, "proto": 20_000_000}

# GPU streams get tids above any Linux tid so they never collide with CPU threads.
_GPU_TID = 1 << 24
# trace_slices(keep): one row per slice of the ranks in `keep` (rank, gpu, key, track, name, cat,
# start, end, bytes); `key` is the stream (gpu) or the thread (cpu), `track` its display name.
# Both writers read the slices through it, the ranks bound as a parameter.
SLICES_MACRO = f"""
CREATE OR REPLACE TEMP MACRO trace_slices(keep) AS TABLE
SELECT rank, true AS gpu, stream AS key, 'GPU ' || device || ' stream ' || stream AS track,
       coalesce(short_name, '') AS name, CASE WHEN short_name LIKE 'nccl%' THEN 'comm' ELSE 'compute' END AS cat,
       start, "end", NULL::BIGINT AS bytes
FROM kernels WHERE list_contains(keep, rank)
UNION ALL
SELECT rank, true, stream, 'GPU ' || device || ' stream ' || stream, 'memcpy ' || kind, 'memory', start, "end", bytes
FROM memcpy WHERE list_contains(keep, rank)
UNION ALL
SELECT rank, true, stream, 'GPU ' || device || ' stream ' || stream, 'memset', 'memory', start, "end", NULL
FROM memset WHERE list_contains(keep, rank)
UNION ALL
SELECT rank, true, stream, 'GPU ' || device || ' stream ' || stream, 'CUDA graph ' || graph_id, 'compute',
       start, "end", NULL
FROM graph_execs WHERE list_contains(keep, rank)
UNION ALL
SELECT rank, false, tid % {_GPU_TID}, 'CPU thread ' || (tid % {_GPU_TID}), coalesce(text, ''),
       coalesce('nvtx:' || domain, 'nvtx'),
       start, "end", NULL
FROM nvtx WHERE list_contains(keep, rank) AND "end" IS NOT NULL
"""

_JSON_SQL = f"""
SELECT to_json({{name: 'process_name', ph: 'M', pid: rank, tid: 0,
                 args: {{name: 'rank ' || rank || coalesce(' (' || host || ')', '')}}}})
FROM ranks WHERE status <> 'missing' AND list_contains(?, rank)
UNION ALL
SELECT to_json({{name: 'thread_name', ph: 'M', pid: rank, tid: CASE WHEN gpu THEN {_GPU_TID} + key ELSE key END,
                 args: {{name: track}}}})
FROM (SELECT DISTINCT rank, gpu, key, track FROM trace_slices(?))
UNION ALL
SELECT CASE WHEN bytes IS NULL
  THEN to_json({{name: name, cat: cat, ph: 'X', pid: rank, tid: CASE WHEN gpu THEN {_GPU_TID} + key ELSE key END,
                ts: start / 1000.0, dur: ("end" - start) / 1000.0}})
  ELSE to_json({{name: name, cat: cat, ph: 'X', pid: rank, tid: {_GPU_TID} + key,
                ts: start / 1000.0, dur: ("end" - start) / 1000.0, args: {{bytes: bytes}}}}) END
FROM trace_slices(?)
"""

_COUNT_SQL = """
SELECT rank, sum(n)::BIGINT FROM (
  SELECT rank, count(*) AS n FROM kernels GROUP BY rank UNION ALL
  SELECT rank, count(*) FROM memcpy GROUP BY rank UNION ALL
  SELECT rank, count(*) FROM memset GROUP BY rank UNION ALL
  SELECT rank, count(*) FROM graph_execs GROUP BY rank UNION ALL
  SELECT rank, count(*) FROM nvtx WHERE "end" IS NOT NULL GROUP BY rank
) GROUP BY rank ORDER BY rank
"""


@dataclass
class TraceResult:
    """What was written: events (slices), the ranks kept and those left out."""

    events: int
    ranks: list[int]
    left_out: list[int] = field(default_factory=list)
    chosen: bool = False  # the ranks were asked for (--ranks), not picked to fit the limit

    @property
    def note(self) -> str:
        if not self.left_out:
            return ""
        why = "not asked for (--ranks)" if self.chosen else (
            "left out to stay under the event limit (--ranks or --max-events choose others)")
        return (f"{len(self.left_out)} of {len(self.ranks) + len(self.left_out)} ranks {why}; "
                f"kept: {_ranges(self.ranks)}")


def trace_format(out: Path) -> str:
    """'proto' or 'json' from the output's suffix."""
    suffix = out.suffix.lower()
    if suffix in PROTO_SUFFIXES:
        return "proto"
    if suffix == ".json":
        return "json"
    raise OrchError(f"-o {out}: name the trace .pftrace (Perfetto protobuf) or .json (Chrome JSON)")


def export_trace(store: Path, out: Path, *, ranks: Iterable[int] | None = None, max_events: int | None = None,
                 priority: Callable[[], Iterable[int]] = tuple, chunk: int = 50_000) -> TraceResult:
    """Write the timeline atomically. `ranks`: exactly these; else every rank while the store
    holds at most `max_events` slices, past that the ranks `priority()` names first (asked only
    then: it may run the analysis), then the others in order, as many as fit (at least one)."""
    fmt = trace_format(out)
    limit = DEFAULT_MAX_EVENTS[fmt] if max_events is None else max_events
    con = attach_store(store)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        check_store_version(con, store)
        counts = dict(con.execute(_COUNT_SQL).fetchall())
        have = [r for r, in con.execute("SELECT rank FROM ranks WHERE status <> 'missing' ORDER BY rank").fetchall()]
        if ranks is not None:
            missing = sorted(set(ranks) - set(have))
            if missing:
                raise OrchError(f"--ranks: no rank {_ranges(missing)} in {store}; it holds ranks {_ranges(have)}")
            kept = sorted(set(ranks))
        else:
            kept = have if sum(counts.values()) <= limit else _choose(have, counts, limit, list(priority()))
        result = TraceResult(sum(counts.get(r, 0) for r in kept), kept, sorted(set(have) - set(kept)),
                             chosen=ranks is not None)
        con.execute(SLICES_MACRO)
        with open(tmp, "wb") as fh:
            if fmt == "json":
                _write_json(con, fh, kept, result.note, chunk)
            else:
                perfetto.write(con, fh, kept, result.note, chunk)
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
        con.close()
    return result


def _choose(have: list[int], counts: dict[int, int], limit: int, priority: list[int]) -> list[int]:
    """The priority ranks, then the rest in order, while their events fit (the first one always)."""
    total = 0

    def fits(rank: int, kept: dict[int, str]) -> bool:
        nonlocal total
        n = counts.get(rank, 0)
        if kept and total + n > limit:
            return False
        total += n
        return True

    present = set(have)
    first = [(r, "priority") for r in priority if r in present]
    return list(pick_ranks(have, first, fill="order", whole=False, fits=fits))


def _write_json(con: duckdb.DuckDBPyConnection, fh: BinaryIO, kept: list[int], note: str, chunk: int) -> None:
    fh.write(b'{"displayTimeUnit": "ms", ')
    if note:
        fh.write(b'"otherData": {"orch": ' + json.dumps(note).encode() + b"}, ")
    fh.write(b'"traceEvents": [\n')
    cur = execute(con, _JSON_SQL, [kept] * _JSON_SQL.count("?"))
    n = 0
    while rows := cur.fetchmany(chunk):
        fh.write(((",\n" if n else "") + ",\n".join(r[0] for r in rows)).encode())
        n += len(rows)
    fh.write(b"\n]}\n")


def _ranges(ranks: list[int]) -> str:
    """0-3,7 for [0, 1, 2, 3, 7]."""
    out: list[str] = []
    for r in sorted(ranks):
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = out[-1].split("-")[0] + f"-{r}"
        else:
            out.append(str(r))
    return ",".join(out)
