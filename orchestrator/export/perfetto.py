"""Perfetto's native trace format (a `Trace` protobuf of `TracePacket`s), written by DuckDB.

Why SQL writes protobuf: a trace of a large job has tens of millions of slices; encoding them in
a Python loop would cost minutes, while DuckDB encodes a chunk of rows at a time. Each packet
comes out as the hex of its bytes (`TracePacket` wrapped as field 1 of `Trace`), already in
timestamp order, and Python only turns chunks of hex into bytes.

What is written (field numbers from perfetto/protos/perfetto/trace/*.proto):
- one process per rank (`TrackDescriptor{uuid, process{pid: rank, process_name}}`), and under it
  one named track per GPU stream and per CPU thread (`TrackDescriptor{uuid, parent_uuid, name}`);
  named tracks rather than thread tracks, because Linux tids of different hosts collide;
- every slice as a `TrackEvent` SLICE_BEGIN (name, category) and SLICE_END on its track; at one
  timestamp ends come before begins, inner slices end first and outer ones begin first, so the
  slices of a track nest the way trace_processor requires;
- a note track when ranks were left out.
Timestamps are ns from the earliest slice kept (the store's clock is shared by every rank).
"""

from __future__ import annotations

from itertools import pairwise
from typing import BinaryIO

import duckdb

from orchestrator.sqltext import execute

# varint(v) as upper-case hex, the minimal protobuf encoding: n is its byte count, and the bytes
# are packed big-endian into one UHUGEINT so that to_hex prints them in wire order. Arguments are
# bound once through a one-element list_transform: a macro repeats its argument's expression at
# every use, and nested fields would otherwise grow the plan exponentially.
_LEN = "CASE " + " ".join(f"WHEN x < {1 << (7 * n)}::UBIGINT THEN {n}" for n in range(1, 10)) + " ELSE 10 END"
_TERMS = " + ".join(
    f"CASE WHEN {i} < n THEN ((((x >> {7 * i}::UBIGINT) & 127::UBIGINT)"
    f" | CASE WHEN {i} < n - 1 THEN 128::UBIGINT ELSE 0::UBIGINT END)::UHUGEINT"
    f" << (8 * (n - {i + 1}))::UHUGEINT) ELSE 0::UHUGEINT END"
    for i in range(10))
MACROS = f"""
CREATE OR REPLACE TEMP MACRO pb_varint(v) AS (
  list_transform([v::UBIGINT], x -> list_transform([{_LEN}], n -> upper(lpad(to_hex({_TERMS}), 2 * n, '0')))[1])[1]);
-- a length-delimited field: key, byte length, bytes (all hex)
CREATE OR REPLACE TEMP MACRO pb_bytes(key, hexval) AS (
  list_transform([hexval], h -> key || pb_varint(length(h) // 2) || h)[1]);
CREATE OR REPLACE TEMP MACRO pb_str(key, s) AS (pb_bytes(key, hex(encode(s))));
"""

# Field keys, (number << 3) | wire type, as hex varints.
_SEQ = "5001"          # TracePacket.trusted_packet_sequence_id (10) = 1
_CLEARED = "6801"      # TracePacket.sequence_flags (13) = SEQ_INCREMENTAL_STATE_CLEARED
_TS = "40"             # TracePacket.timestamp (8)
_DESC = "E203"         # TracePacket.track_descriptor (60)
_EVENT = "5A"          # TracePacket.track_event (11)
_PACKET = "0A"         # Trace.packet (1)

# The tracks (one per rank, and per GPU stream and CPU thread under it) and the distinct (name,
# category) pairs of the kept slices are small tables made first.
# (CREATE cannot be PREPAREd with the rank lists: empty tables first, then INSERT ... SELECT.)
_TABLES = """
CREATE OR REPLACE TEMP TABLE _pf_tracks (rank INTEGER, gpu BOOLEAN, key BIGINT, track VARCHAR, puuid UBIGINT,
                                         uuid UBIGINT, first BIGINT, tix BIGINT, trk VARCHAR);
CREATE OR REPLACE TEMP TABLE _pf_names (name VARCHAR, cat VARCHAR, nid BIGINT, hex VARCHAR);
CREATE OR REPLACE TEMP TABLE _pf_ev (id BIGINT, b BIGINT, e BIGINT, tix BIGINT, nid BIGINT);
"""
# trk: TrackEvent.track_uuid (11) as bytes, once per track.
_TRACKS = """
INSERT INTO _pf_tracks
SELECT *, '58' || pb_varint(uuid) AS trk FROM (
  SELECT rank, gpu, key, any_value(track) AS track,
         (rank::UBIGINT + 1) << 26 AS puuid,
         ((rank::UBIGINT + 1) << 26) + 1 + CASE WHEN gpu THEN 33554432 ELSE 0 END + key::UBIGINT AS uuid,
         min(start) AS first, row_number() OVER (ORDER BY rank, gpu, key) AS tix
  FROM trace_slices(?) WHERE start IS NOT NULL AND "end" >= start GROUP BY rank, gpu, key)
"""
# TrackEvent.name (23) and .categories (22) as bytes, once per distinct pair; an event carries
# the pair's number (nid) until its part makes its bytes.
_NAMES = """
INSERT INTO _pf_names
SELECT name, cat, row_number() OVER (ORDER BY name, cat) AS nid, pb_str('BA01', name) || pb_str('B201', cat) AS hex
FROM (SELECT DISTINCT name, cat FROM trace_slices(?) WHERE start IS NOT NULL AND "end" >= start)
"""
# The descriptors (no timestamp: they come first): one process per rank, its tracks, the note.
_DESCRIPTORS = f"""
SELECT '{_PACKET}' || pb_varint(length(p) // 2) || p FROM (
  SELECT 0 AS cls, rank AS k1, {_SEQ} || {_CLEARED} || pb_bytes('{_DESC}', '08' || pb_varint(puuid) || pb_bytes('1A',
           '08' || pb_varint(rank) || pb_str('32', 'rank ' || rank || coalesce(' (' || host || ')', '')))) AS p
  FROM (SELECT DISTINCT rank, puuid FROM _pf_tracks) JOIN ranks USING (rank)
  UNION ALL
  SELECT 1, uuid, {_SEQ} || {_CLEARED} || pb_bytes('{_DESC}', '08' || pb_varint(uuid) || '28' || pb_varint(puuid)
           || pb_str('12', track))
  FROM _pf_tracks
  UNION ALL
  SELECT 2, 0, {_SEQ} || {_CLEARED} || pb_bytes('{_DESC}', '0801' || pb_str('12', ?)) WHERE ? <> ''
  ORDER BY cls, k1
)
"""
# The events, once, as integers (times, the track's and the name's numbers): each part below
# reads its slices from here and makes only its own packets' bytes. A slice is two packets (begin
# at b, end at e); at one timestamp ends come before begins, inner slices end first and outer
# ones begin first, a zero-length slice's pair after every begin.
_EVENTS = """
INSERT INTO _pf_ev
WITH s AS (  -- numbered in the slices' own order (id breaks ties between equal slices of a track)
  SELECT rank, gpu, key, name, cat, start, "end", row_number() OVER () AS id
  FROM trace_slices(?) WHERE start IS NOT NULL AND "end" >= start
),
t0 AS (SELECT coalesce(min(first), 0) AS t0 FROM _pf_tracks)
SELECT s.id, s.start - t0.t0 AS b, s."end" - t0.t0 AS e, t.tix, n.nid
FROM s JOIN _pf_tracks t USING (rank, gpu, key) JOIN _pf_names n USING (name, cat) CROSS JOIN t0
"""
# Where the timeline is cut: packet timestamps near equal-count quantiles, from a sample (an
# exact quantile holds every timestamp outside DuckDB's memory cap; any sorted cuts are right,
# since a timestamp never straddles two parts and the parts in order are the trace in order).
_CUTS = """
SELECT coalesce(list(DISTINCT q ORDER BY q), []) FROM (
  SELECT unnest(reservoir_quantile(ts, ?::DOUBLE[])) AS q
  FROM (SELECT b AS ts FROM _pf_ev UNION ALL SELECT e FROM _pf_ev))
"""
# One part of the timeline, [lo, hi) (the first part open below, the last above), in order:
# sorting the whole trace at once held every packet's bytes, and a few million slices ran out of
# DuckDB's memory cap.
_PART = f"""
SELECT '{_PACKET}' || pb_varint(length(p) // 2) || p FROM (
  SELECT x.ts, x.cls, x.k1, x.k2, '{_TS}' || pb_varint(x.ts) || {_SEQ} || pb_bytes('{_EVENT}', CASE WHEN x.nid IS NULL
           THEN '4802' || t.trk ELSE '4801' || t.trk || n.hex END) AS p
  FROM (
    SELECT b AS ts, CASE WHEN b = e THEN 3 ELSE 2 END AS cls, CASE WHEN b = e THEN id ELSE -e END AS k1,
           CASE WHEN b = e THEN 0 ELSE id END AS k2, tix, nid
    FROM _pf_ev WHERE (b >= ? OR ?) AND (b < ? OR ?)
    UNION ALL
    SELECT e, CASE WHEN b = e THEN 3 ELSE 1 END, CASE WHEN b = e THEN id ELSE -b END,
           CASE WHEN b = e THEN 1 ELSE -id END, tix, NULL
    FROM _pf_ev WHERE (e >= ? OR ?) AND (e < ? OR ?)
  ) x JOIN _pf_tracks t USING (tix) LEFT JOIN _pf_names n USING (nid)
  ORDER BY x.ts, x.cls, x.k1, x.k2
)
"""
PART_PACKETS = 1_000_000  # packets a part holds, about: ~100 MB of sort at most


def write(con: duckdb.DuckDBPyConnection, fh: BinaryIO, ranks: list[int], note: str, chunk: int = 50_000) -> None:
    """Write the slices of `ranks` as a Perfetto trace: those of the table macro
    `trace_slices(ranks)` that `con` holds (export/trace.py makes it)."""
    con.execute(MACROS)
    con.execute(_TABLES)
    for sql in (_TRACKS, _NAMES, _EVENTS):
        execute(con, sql, [ranks])
    (n,) = con.execute("SELECT 2 * count(*) FROM _pf_ev").fetchone()
    parts = max(1, -(-n // PART_PACKETS))
    cuts = execute(con, _CUTS, [[i / parts for i in range(1, parts)]]).fetchone()[0] if parts > 1 else []
    edges = [0, *cuts, 0]  # the first part is open below, the last above (the zeros are not read)
    last = len(edges) - 2
    queries = [(_DESCRIPTORS, [note, note])] + [
        (_PART, [lo, i == 0, hi, i == last] * 2) for i, (lo, hi) in enumerate(pairwise(edges))]
    for sql, params in queries:
        cur = execute(con, sql, params)
        while rows := cur.fetchmany(chunk):
            fh.write(bytes.fromhex("".join(r[0] for r in rows)))
