"""`orch export-trace`: all ranks as one Chrome/Perfetto JSON timeline, one process per rank.

Events are serialized by DuckDB (to_json) and streamed to the file in chunks, so a store of
hundreds of ranks never sits in Python memory. Only names and times leave the store: no
captured environment is written.
"""

from __future__ import annotations

import os
from pathlib import Path

from orchestrator.analyze.engine import open_store

# GPU streams get tids above any Linux tid so they never collide with CPU threads.
_GPU_TID = 1 << 24
_EVENTS_SQL = f"""
SELECT to_json({{name: 'process_name', ph: 'M', pid: rank, tid: 0,
                 args: {{name: 'rank ' || rank || coalesce(' (' || host || ')', '')}}}})
FROM ranks WHERE status <> 'missing'
UNION ALL
SELECT to_json({{name: 'thread_name', ph: 'M', pid: rank, tid: {_GPU_TID} + stream,
                 args: {{name: 'GPU ' || device || ' stream ' || stream}}}})
FROM (SELECT DISTINCT rank, device, stream FROM kernels)
UNION ALL
SELECT to_json({{name: 'thread_name', ph: 'M', pid: rank, tid: tid % {_GPU_TID},
                 args: {{name: 'CPU thread ' || (tid % {_GPU_TID})}}}})
FROM (SELECT DISTINCT rank, tid FROM nvtx)
UNION ALL
SELECT to_json({{name: short_name, cat: CASE WHEN short_name LIKE 'nccl%' THEN 'comm' ELSE 'compute' END,
                 ph: 'X', pid: rank, tid: {_GPU_TID} + stream,
                 ts: start / 1000.0, dur: ("end" - start) / 1000.0}}) FROM kernels
UNION ALL
SELECT to_json({{name: 'memcpy ' || kind, cat: 'memory', ph: 'X', pid: rank, tid: {_GPU_TID} + stream,
                 ts: start / 1000.0, dur: ("end" - start) / 1000.0, args: {{bytes: bytes}}}}) FROM memcpy
UNION ALL
SELECT to_json({{name: 'memset', cat: 'memory', ph: 'X', pid: rank, tid: {_GPU_TID} + stream,
                 ts: start / 1000.0, dur: ("end" - start) / 1000.0}}) FROM memset
UNION ALL
SELECT to_json({{name: coalesce(text, ''), cat: 'nvtx:' || domain, ph: 'X', pid: rank,
                 tid: tid % {_GPU_TID}, ts: start / 1000.0, dur: ("end" - start) / 1000.0}}) FROM nvtx
"""


def export_trace(store: Path, out: Path, chunk: int = 50_000) -> int:
    """Write the timeline atomically; returns the number of events."""
    con = open_store(store)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    n = 0
    try:
        cur = con.execute(_EVENTS_SQL)
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write('{"displayTimeUnit": "ms", "traceEvents": [\n')
            while rows := cur.fetchmany(chunk):
                fh.write((",\n" if n else "") + ",\n".join(r[0] for r in rows))
                n += len(rows)
            fh.write("\n]}\n")
        tmp.replace(out)
    finally:
        tmp.unlink(missing_ok=True)
        con.close()
    return n
