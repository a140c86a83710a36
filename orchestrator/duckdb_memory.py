"""How much memory DuckDB may take in one orch process, where it spills past that, and on how
many threads it works.

One setting for the collect and the analysis: `ORCH_DUCKDB_MEMORY` (default 512MB). Without a
limit DuckDB takes up to 80 % of the machine and keeps every analysis table in memory; with a
cap and a spill directory a large report takes far less memory, in the same time, with an
identical report. 512MB, not more: DuckDB fills the cap it is given, so a process peaks at the
cap plus its own few hundred MB, and on the largest stores measured a higher cap bought no time
(docs/benchmarks-code.md, docs/scale.md).
The collect spills next to the store it writes (`.duckdb-spill`, as large as the store can
be); the analysis, which only reads a store, to a fresh path under the system temp directory
(never the user's working directory, DuckDB's default for an in-memory database). DuckDB
creates the directory on first spill and removes it when the connection closes.

The threads: `ORCH_DUCKDB_THREADS` (default: the machine's cores) caps the analysis' DuckDB
threads and the files it runs at once (the collect's exports and ingests follow `--workers`),
wherever orch would take more: on a login node shared with others, or beside other work that
already fills the cores, where one thread spent 13 to 39 % less CPU on the same report than two
(docs/benchmarks-code.md).
"""

from __future__ import annotations

import os
import re
import secrets
import tempfile
from typing import TYPE_CHECKING

from orchestrator.errors import OrchError
from orchestrator.sqltext import set_option

if TYPE_CHECKING:
    import duckdb

_SIZE = re.compile(r"^\s*\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KIB|MIB|GIB|TIB)\s*$", re.IGNORECASE)


def memory_limit() -> str:
    """ORCH_DUCKDB_MEMORY, checked: a bad value fails in one line before any work."""
    value = os.environ.get("ORCH_DUCKDB_MEMORY", "512MB")
    if not _SIZE.match(value):
        raise OrchError(f"ORCH_DUCKDB_MEMORY={value!r} is not a size; use e.g. ORCH_DUCKDB_MEMORY=4GB")
    return value.strip()


def cores() -> int:
    """The threads one orch process works on: ORCH_DUCKDB_THREADS, checked (a bad value fails
    in one line before any work), else the machine's cores."""
    value = os.environ.get("ORCH_DUCKDB_THREADS", "").strip()
    if not value:
        return os.cpu_count() or 1
    if not value.isdecimal() or not 1 <= int(value) <= 1024:
        raise OrchError(f"ORCH_DUCKDB_THREADS={value!r} is not a number of threads from 1 to 1024; "
                        "use e.g. ORCH_DUCKDB_THREADS=4, or unset it for all the cores")
    return int(value)


def out_of_memory(e: BaseException, what: str) -> OrchError | None:
    """The one-line error for DuckDB running out of the memory orch gives it (some operators
    cannot spill all they hold), naming the fix; None for any other error. (A rank's ingest that
    runs out is that rank's failure, noted on it: a hostile report must not cost the others.)"""
    if not any(c.__name__ == "OutOfMemoryException" for c in type(e).__mro__):
        return None
    return OrchError(f"{what}: DuckDB ran out of the {memory_limit()} of memory orch gives it "
                     f"({str(e).splitlines()[0]}); set ORCH_DUCKDB_MEMORY higher (e.g. ORCH_DUCKDB_MEMORY=4GB) "
                     "and run the command again")


def limit(con: duckdb.DuckDBPyConnection, spill: str | None = None) -> None:
    """Cap `con` at the memory limit and let it spill to `spill` (default: a fresh temp path)."""
    spill = spill or os.path.join(tempfile.gettempdir(), f"orch-spill-{os.getpid()}-{secrets.token_hex(4)}")
    set_option(con, "memory_limit", memory_limit())
    set_option(con, "temp_directory", spill)
