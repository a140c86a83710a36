"""Numbers and text that come from a trace or a file name, parsed and checked in ONE place.

A profiled program controls its environment (`RANK`, `LOCAL_RANK`), its thread and range
names, and users name files and folders as they like. Python's `int()` and `str.isdigit()`
accept far more than a rank (`int("²")` fails, `"²".isdigit()` is True, `int("3000000000")`
does not fit DuckDB's INTEGER), and one out-of-range value in a bulk insert would fail every
rank. So each value is parsed here, against the range its store column can hold, and a
bad one raises `BadValue` with a one-line reason that the caller records on that rank only.
"""

from __future__ import annotations

import re

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
# Timestamps: ns since 1970 up to 2^62 (year 2116), so that offsets between ranks and the
# relative times added to them stay inside BIGINT.
EPOCH_NS_MAX = 2**62

_ASCII_INT = re.compile(r"[+-]?[0-9]{1,19}")


class BadValue(ValueError):
    """A value from a trace or a file name that orch cannot use; str() is the one-line reason."""


def parse_int(value: object, what: str, lo: int, hi: int) -> int:
    """An ASCII decimal integer in [lo, hi]; anything else raises `BadValue` naming `what`.

    Quotes around the value (nsys stores `RANK="3"`) and surrounding blanks are ignored."""
    if isinstance(value, bool):
        raise BadValue(f"{what}={value!r} is not an integer")
    if isinstance(value, int):
        n = value
    else:
        s = str(value).strip().strip('"').strip()
        if not _ASCII_INT.fullmatch(s):
            raise BadValue(f"{what}={_show(s)} is not a decimal integer")
        n = int(s)
    if not lo <= n <= hi:
        raise BadValue(f"{what}={n} is out of range [{lo}, {hi}]")
    return n


def rank(value: object, what: str = "rank") -> int:
    return parse_int(value, what, 0, INT32_MAX)


def pid(value: object, what: str = "pid") -> int:
    return parse_int(value, what, 0, INT64_MAX)


def epoch_ns(value: object, what: str = "utcEpochNs") -> int:
    return parse_int(value, what, 0, EPOCH_NS_MAX)


def optional(fn, value: object, what: str) -> tuple[int | None, str | None]:
    """(value, None), (None, None) for an absent value, or (None, reason) for a bad one."""
    if value is None or (isinstance(value, str) and value.strip().strip('"').strip() == ""):
        return None, None
    try:
        return fn(value, what), None
    except BadValue as e:
        return None, str(e)


def text(value: object) -> str | None:
    """A string safe to store: undecodable bytes (a file name in another encoding comes to
    Python as lone surrogates) become U+FFFD instead of failing the Arrow/DuckDB insert."""
    if value is None:
        return None
    s = value if isinstance(value, str) else str(value)
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "replace") if _has_surrogates(s) else s


def decode(raw: bytes) -> str:
    """sqlite3 text_factory: invalid UTF-8 in a trace string becomes U+FFFD, never an error."""
    return raw.decode("utf-8", "replace")


class CountingDecoder:
    """sqlite3 text_factory like `decode` that also counts the strings it had to repair, so the
    reader can note on the rank that it did."""

    def __init__(self) -> None:
        self.bad = 0

    def __call__(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            self.bad += 1
            return decode(raw)


def _has_surrogates(s: str) -> bool:
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _show(s: str) -> str:
    """A short, printable rendering of a bad value for a one-line reason."""
    out = s if len(s) <= 24 else s[:24] + "..."
    return ascii(out)
