"""Subcommands of the later pipeline stages (submit, status, cancel, collect, report...)."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def register(sub: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    return {}
