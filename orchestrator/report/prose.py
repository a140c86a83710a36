"""The report's sentences on a console: wrapped under their bullet, never past the terminal.

A finding's evidence is prose of any length. It is wrapped here at the narrower of WIDTH (a
comfortable line in a wide window, a file or a CI log) and the console's width: a line longer
than a terminal would be wrapped again by rich at the terminal's edge, folding every sentence
in two uneven pieces.
"""

from __future__ import annotations

import textwrap

from rich.console import Console

WIDTH = 100


def say(console: Console, text: str, indent: str = "    ", wide: bool = False) -> None:
    """Print plain `text` (no markup), wrapped with `indent` under its first line; with `wide`,
    whole (the terminal wraps it)."""
    if not wide:
        text = textwrap.fill(text, min(WIDTH, console.width), subsequent_indent=indent, break_on_hyphens=False)
    console.print(text, markup=False, highlight=False)
