"""`.sqlite.gz` decompression with a size cap, and cleanup of temp files of killed runs.

A gzip bomb (GiBs of zeros in a few MB) must not fill the disk: decompression streams, and
stops past a cap relative to the compressed size (real nsys exports compress 3-10x) and an
absolute one; `ORCH_MAX_EXPORT_BYTES` replaces both caps. The partial output is removed.
"""

from __future__ import annotations

import gzip
import os
import re
from pathlib import Path

from orchestrator import numbers

RATIO = 100  # decompressed / compressed, far above any real export
FLOOR = 256 << 20  # small files may always expand this far
ABSOLUTE = 32 << 30
ENV = "ORCH_MAX_EXPORT_BYTES"


class TooLarge(ValueError):
    """Decompression passed the cap; str() is the one-line reason (naming how to raise it)."""


def cap_for(compressed_bytes: int) -> tuple[int, str]:
    """(cap in bytes, how it was chosen) for a file of `compressed_bytes`."""
    raw = os.environ.get(ENV)
    if raw:
        try:
            return numbers.parse_int(raw, ENV, 1, numbers.INT64_MAX), f"{ENV}"
        except numbers.BadValue:
            pass  # an unusable setting falls back to the default caps
    cap = min(max(RATIO * compressed_bytes, FLOOR), ABSOLUTE)
    return cap, f"{RATIO}x the compressed size, at most {ABSOLUTE >> 30} GiB"


def gunzip_capped(src: Path, dst: Path, chunk: int = 1 << 20) -> None:
    """Stream `src` (gzip) into `dst`; raise `TooLarge` (dst removed) past the cap."""
    cap, how = cap_for(src.stat().st_size)
    written = 0
    try:
        with gzip.open(src, "rb") as fi, open(dst, "wb") as fo:
            while block := fi.read(chunk):
                written += len(block)
                if written > cap:
                    raise TooLarge(
                        f"decompressed size passes the cap of {cap} bytes ({how}): not a plausible export; "
                        f"set {ENV}=<bytes> to allow more"
                    )
                fo.write(block)
    except BaseException:
        dst.unlink(missing_ok=True)
        raise


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OverflowError:
        return False
    return True


def clean_stale(folder: Path, pattern: re.Pattern[str]) -> list[Path]:
    """Remove files in `folder` whose name matches `pattern` (group `pid`) when that process
    is gone: temp files of a collect that was killed. Returns what was removed."""
    gone: list[Path] = []
    try:
        with os.scandir(folder) as it:  # (no Path per entry: a reduce looks in thousands of folders)
            names = [e.name for e in it]
    except OSError:
        return gone
    for name in names:
        m = pattern.fullmatch(name)
        if not m:
            continue
        f = folder / name
        pid, bad = numbers.optional(numbers.pid, m["pid"], "pid")
        if bad or pid is None or pid == os.getpid() or pid_alive(pid):
            continue
        try:
            f.unlink()
            gone.append(f)
        except OSError:
            pass
    return gone
