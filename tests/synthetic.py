"""Minimal nsys-schema SQLite exports with chosen timelines, for rules no real fixture
triggers. Only the tables and columns orch reads are written (schema 3.20 names)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

SCHEMA = """
CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT);
CREATE TABLE META_DATA_CAPTURE (name TEXT NOT NULL, value TEXT);
CREATE TABLE TARGET_INFO_SESSION_START_TIME (utcEpochNs INTEGER, utcTime TEXT, localTime TEXT);
CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, text TEXT,
                          globalTid INTEGER, textId INTEGER, domainId INTEGER);
CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, globalTid INTEGER,
                                          correlationId INTEGER, nameId INTEGER NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
                                         streamId INTEGER NOT NULL, correlationId INTEGER,
                                         demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL);
CREATE TABLE CUPTI_ACTIVITY_KIND_MEMCPY (start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL,
                                         streamId INTEGER NOT NULL, correlationId INTEGER, bytes INTEGER NOT NULL,
                                         copyKind INTEGER NOT NULL, srcKind INTEGER, dstKind INTEGER);
"""
TID = 1000
MS = 1_000_000


class Export:
    """Build one rank's export; times in ns relative to the session start."""

    def __init__(self, path: Path, rank: int, session_start: int = 1_800_000_000_000_000_000) -> None:
        self.con = sqlite3.connect(path)
        self.con.executescript(SCHEMA)
        self.corr = 0
        self.strings: dict[str, int] = {}
        self.con.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)",
                             [("EXPORT_PRODUCT_VERSION", "2025.3.2.0"), ("EXPORT_SCHEMA_VERSION", "3.20.3")])
        self.con.execute("INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', ?)",
                         [f'RANK="{rank}"'])
        self.con.execute("INSERT INTO TARGET_INFO_SESSION_START_TIME VALUES (?, '', '')", [session_start])

    def _sid(self, s: str) -> int:
        if s not in self.strings:
            self.strings[s] = len(self.strings) + 1
            self.con.execute("INSERT INTO StringIds VALUES (?, ?)", [self.strings[s], s])
        return self.strings[s]

    def nvtx(self, start: int, end: int, text: str, tid: int = TID, event_type: int = 59) -> None:
        """A push/pop range (59), or with event_type=60 a start/end range (may overlap others)."""
        self.con.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, ?, ?, ?, NULL, 0)", [start, end, event_type, text, tid])

    def _launch(self, at: int, tid: int = TID) -> int:
        self.corr += 1
        self.con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, ?)",
                         [at, at + 2000, tid, self.corr, self._sid("cudaLaunchKernel")])
        return self.corr

    def kernel(self, launch: int, start: int, end: int, name: str, stream: int = 7, tid: int = TID) -> None:
        c = self._launch(launch, tid)
        self.con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, 0, ?, ?, ?, ?)",
                         [start, end, stream, c, self._sid(name), self._sid(name)])

    def memcpy(self, launch: int, start: int, end: int, nbytes: int, src_kind: int) -> None:
        c = self._launch(launch)
        self.con.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMCPY VALUES (?, ?, 0, 7, ?, ?, 1, ?, 2)",
                         [start, end, c, nbytes, src_kind])

    def close(self) -> None:
        self.con.commit()
        self.con.close()
