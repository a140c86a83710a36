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

_SQL = f"""
WITH s AS (
  SELECT *, row_number() OVER () AS id FROM ({{slices}}) WHERE start IS NOT NULL AND "end" >= start
),
t0 AS (SELECT coalesce(min(start), 0) AS t0 FROM s),
tracks AS (
  SELECT rank, gpu, key, any_value(track) AS track,
         (rank::UBIGINT + 1) << 26 AS puuid,
         ((rank::UBIGINT + 1) << 26) + 1 + CASE WHEN gpu THEN 33554432 ELSE 0 END + key::UBIGINT AS uuid
  FROM s GROUP BY rank, gpu, key
),
names AS (  -- TrackEvent.name (23) and .categories (22), once per distinct pair
  SELECT name, cat, pb_str('BA01', name) || pb_str('B201', cat) AS hex FROM (SELECT DISTINCT name, cat FROM s)
),
ev AS (
  SELECT s.id, s.start - t0.t0 AS b, s."end" - t0.t0 AS e, s.start = s."end" AS zero,
         '58' || pb_varint(tracks.uuid) AS trk, names.hex AS nm
  FROM s
  JOIN tracks USING (rank, gpu, key)
  JOIN names USING (name, cat)
  CROSS JOIN t0
),
packets AS (
  SELECT -1 AS ts, 0 AS cls, rank AS k1, 0 AS k2,
         {_SEQ} || {_CLEARED} || pb_bytes('{_DESC}', '08' || pb_varint(puuid) || pb_bytes('1A',
           '08' || pb_varint(rank) || pb_str('32', 'rank ' || rank || coalesce(' (' || host || ')', '')))) AS p
  FROM (SELECT DISTINCT rank, puuid FROM tracks) JOIN ranks USING (rank)
  UNION ALL
  SELECT -1, 1, uuid, 0,
         {_SEQ} || {_CLEARED} || pb_bytes('{_DESC}', '08' || pb_varint(uuid) || '28' || pb_varint(puuid)
           || pb_str('12', track))
  FROM tracks
  UNION ALL
  SELECT -1, 2, 0, 0, {_SEQ} || {_CLEARED} || pb_bytes('{_DESC}', '0801' || pb_str('12', ?)) WHERE ? <> ''
  UNION ALL  -- begins: outer (later end) first; a zero-length slice's pair after every begin
  SELECT b, CASE WHEN zero THEN 3 ELSE 2 END, CASE WHEN zero THEN id ELSE -e END, CASE WHEN zero THEN 0 ELSE id END,
         '{_TS}' || pb_varint(b) || {_SEQ} || pb_bytes('{_EVENT}', '4801' || trk || nm)
  FROM ev
  UNION ALL  -- ends: inner (later start) first, before the begins of the same timestamp
  SELECT e, CASE WHEN zero THEN 3 ELSE 1 END, CASE WHEN zero THEN id ELSE -b END, CASE WHEN zero THEN 1 ELSE -id END,
         '{_TS}' || pb_varint(e) || {_SEQ} || pb_bytes('{_EVENT}', '4802' || trk)
  FROM ev
)
SELECT '{_PACKET}' || pb_varint(length(p) // 2) || p FROM packets ORDER BY ts, cls, k1, k2
"""


def write(con: duckdb.DuckDBPyConnection, fh: BinaryIO, slices: str, ranks: list[int], note: str,
          chunk: int = 50_000) -> None:
    """Write the slices of `ranks` (`slices`: SQL with one `?` per rank list) as a Perfetto trace."""
    con.execute(MACROS)
    sql = _SQL.format(slices=slices)
    n_lists = slices.count("?")
    cur = execute(con, sql, [ranks] * n_lists + [note, note])
    while rows := cur.fetchmany(chunk):
        fh.write(bytes.fromhex("".join(r[0] for r in rows)))
