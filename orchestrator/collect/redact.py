"""`orch redact`: copies of SQLite exports that are safe to share.

nsys records the profiled process's whole environment (tokens, passwords, cloud keys) in
META_DATA_CAPTURE, and its command line (`--hf-token=...`, `--api-key X`) there and in the
process tables. A redacted copy keeps only the allow-listed launcher/Slurm variables (the
same list the merged store keeps), replaces command-line arguments that look like secrets
with `<redacted>`, is VACUUMed so deleted values leave no trace in free pages, and is
gzip-compressed. The input is never modified.
"""

from __future__ import annotations

import gzip
import os
import re
import shutil
import sqlite3
from pathlib import Path

from orchestrator.collect.decompress import TooLarge, gunzip_capped
from orchestrator.collect.probe import ENV_ALLOW
from orchestrator.errors import OrchError

REDACTED = "<redacted>"
# A flag or key whose name says it holds a secret: --hf-token, --api-key, password=, ...
_SECRET_KEY = re.compile(
    r"(token(?!s|izer)|secret|passw(or)?d|passphrase|api[-_]?key|access[-_]?key|private[-_]?key|credential|"
    r"auth(?!or)|"
    r"session[-_]?key|client[-_]?secret|signature)",
    re.IGNORECASE,
)
# Values that are secrets by their shape, wherever they appear.
_SECRET_SHAPE = re.compile(
    r"(AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key id
    r"|AIza[0-9A-Za-z_\-]{35}"  # Google API key
    r"|ya29\.[0-9A-Za-z_\-]{20,}"  # Google OAuth token
    r"|hf_[0-9A-Za-z]{20,}"  # Hugging Face
    r"|gh[pousr]_[0-9A-Za-z]{30,}"  # GitHub
    r"|xox[abprs]-[0-9A-Za-z-]{10,}"  # Slack
    r"|sk-[0-9A-Za-z_\-]{20,}"  # OpenAI-style keys
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
)
_CMDLINE_NAME = re.compile(r"(^|:)(COMMAND|ARGUMENT_\d+|COMMAND_LINE|ARGS?)$", re.IGNORECASE)


def _key_is_secret(key: str) -> bool:
    return bool(_SECRET_KEY.search(key))


def redact_args(args: list[str]) -> list[str]:
    """The same arguments with secret values replaced: `--x-token=V` / `password=V` keep their
    key, `--api-key V` loses the next argument, and secret-shaped values go wherever they are."""
    out: list[str] = []
    hide_next = False
    for a in args:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        key, eq, _value = a.partition("=")
        if eq and _key_is_secret(key):
            out.append(f"{key}={REDACTED}")
        elif a.startswith("-") and not eq and _key_is_secret(a):
            out.append(a)
            hide_next = True
        else:
            out.append(_SECRET_SHAPE.sub(REDACTED, a))
    return out


def redact_text(s: str) -> str:
    """A whole command line in one string: split on blanks, redact, join."""
    parts = re.split(r"(\s+)", s)
    words = parts[::2]
    red = redact_args(words)
    parts[::2] = red
    return "".join(parts)


def _redact_command_lines(con: sqlite3.Connection, tables: set[str]) -> None:
    if "META_DATA_CAPTURE" in tables:
        rows = con.execute("SELECT rowid, name, value FROM META_DATA_CAPTURE WHERE value IS NOT NULL").fetchall()
        by_proc: dict[str, list[tuple[int, int, str]]] = {}
        for rid, name, value in rows:
            name = str(name)
            if _CMDLINE_NAME.search(name):
                proc, _, field = name.rpartition(":")
                n = int(field.rpartition("_")[2]) if field.upper().startswith("ARGUMENT_") else -1
                by_proc.setdefault(proc, []).append((n, rid, str(value)))
        for items in by_proc.values():
            items.sort()
            args = [v for _, _, v in items]
            # One argument may itself be a whole command line (e.g. `bash -c "... --token x"`).
            red = [redact_text(v) if " " in v else v for v in redact_args(args)]
            con.executemany("UPDATE META_DATA_CAPTURE SET value = ? WHERE rowid = ?",
                            [(new, rid) for (_, rid, old), new in zip(items, red, strict=True) if new != old])
    # Process names and any column that holds a command line in other tables.
    for table in sorted(tables):
        quoted = table.replace('"', '""')
        cols = [r[1] for r in con.execute(f'PRAGMA table_info("{quoted}")')]
        for col in cols:
            if (table == "PROCESSES" and col == "name") or re.search(r"command|cmdline|args", col, re.IGNORECASE):
                qc = col.replace('"', '""')
                vals = con.execute(f'SELECT rowid, "{qc}" FROM "{quoted}" WHERE typeof("{qc}") = \'text\'').fetchall()
                upd = [(redact_text(v), rid) for rid, v in vals if redact_text(v) != v]
                con.executemany(f'UPDATE "{quoted}" SET "{qc}" = ? WHERE rowid = ?', upd)


def redact_export(src: Path, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    name = src.name.removesuffix(".gz").removesuffix(".sqlite")
    tmp = out_dir / f".{name}.redact-{os.getpid()}.sqlite"
    dest = out_dir / f"{name}.sqlite.gz"
    try:
        if src.name.endswith(".gz"):
            gunzip_capped(src, tmp)
        else:
            shutil.copyfile(src, tmp)
        con = sqlite3.connect(tmp)
        con.text_factory = lambda b: b.decode("utf-8", "replace")
        try:
            tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
            if "META_DATA_CAPTURE" in tables:
                rows = con.execute("SELECT rowid, value FROM META_DATA_CAPTURE "
                                   "WHERE name LIKE '%ENVIRONMENT_VARIABLE'").fetchall()
                drop = [(rid,) for rid, value in rows if not ENV_ALLOW.match(str(value).partition("=")[0])]
                con.executemany("DELETE FROM META_DATA_CAPTURE WHERE rowid = ?", drop)
            _redact_command_lines(con, tables)
            con.commit()
            con.execute("VACUUM")
        finally:
            con.close()
        with open(tmp, "rb") as fi, gzip.open(f"{dest}.part", "wb", compresslevel=9) as fo:
            shutil.copyfileobj(fi, fo)
        os.replace(f"{dest}.part", dest)
    except TooLarge as e:
        raise OrchError(f"cannot redact {src}: {e}") from None
    except (sqlite3.DatabaseError, OSError, EOFError) as e:
        raise OrchError(f"cannot redact {src} ({e}); is it an nsys SQLite export?") from None
    finally:
        tmp.unlink(missing_ok=True)
        Path(f"{dest}.part").unlink(missing_ok=True)
    return dest
