"""`orch redact`: copies of SQLite exports that are safe to share.

nsys records the profiled process's whole environment (tokens, passwords, cloud keys) in
META_DATA_CAPTURE. A redacted copy keeps only the allow-listed launcher/Slurm variables
(the same list the merged store keeps), is VACUUMed so deleted values leave no trace in free
pages, and is gzip-compressed. The input is never modified.
"""

from __future__ import annotations

import gzip
import os
import shutil
import sqlite3
from pathlib import Path

from orchestrator.collect.probe import ENV_ALLOW
from orchestrator.errors import OrchError


def redact_export(src: Path, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    name = src.name.removesuffix(".gz").removesuffix(".sqlite")
    tmp = out_dir / f".{name}.redact-{os.getpid()}.sqlite"
    dest = out_dir / f"{name}.sqlite.gz"
    try:
        if src.name.endswith(".gz"):
            with gzip.open(src, "rb") as fi, open(tmp, "wb") as fo:
                shutil.copyfileobj(fi, fo)
        else:
            shutil.copyfile(src, tmp)
        con = sqlite3.connect(tmp)
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "META_DATA_CAPTURE" in tables:
                rows = con.execute("SELECT rowid, value FROM META_DATA_CAPTURE "
                                   "WHERE name LIKE '%ENVIRONMENT_VARIABLE'").fetchall()
                drop = [(rid,) for rid, value in rows if not ENV_ALLOW.match(str(value).partition("=")[0])]
                con.executemany("DELETE FROM META_DATA_CAPTURE WHERE rowid = ?", drop)
            con.commit()
            con.execute("VACUUM")
        finally:
            con.close()
        with open(tmp, "rb") as fi, gzip.open(f"{dest}.part", "wb", compresslevel=9) as fo:
            shutil.copyfileobj(fi, fo)
        os.replace(f"{dest}.part", dest)
    except (sqlite3.DatabaseError, OSError, EOFError) as e:
        raise OrchError(f"cannot redact {src} ({e}); is it an nsys SQLite export?") from None
    finally:
        tmp.unlink(missing_ok=True)
        Path(f"{dest}.part").unlink(missing_ok=True)
    return dest
