"""Trace strings are data: what a profiled program wrote (NVTX names, host names, kernel
names) must never act as terminal control sequences or rich markup when printed."""

from __future__ import annotations

import re

# C0 and C1 control characters (ESC, BEL, CSI...), DEL, and Unicode bidi overrides.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def plain(text: object) -> str:
    """One printable line: control characters shown as U+FFFD, newlines as spaces (a name with
    newlines must not print lines that look like orch's own), tabs kept."""
    return _CONTROL.sub("\ufffd", str(text)).replace("\n", " ")


def cell(text: object) -> str:
    """Text for a rich table cell or a markup-enabled print: printable and markup-escaped."""
    from rich.markup import escape  # here: the CLI loads this module before rich (cli/common.py)

    return escape(plain(text))
