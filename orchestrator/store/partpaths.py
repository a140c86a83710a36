"""The names of the parts' files (the layout collect/parts.py describes): the one place that
makes a part's path and reads a rank back from it, below collect, whose map writes the parts,
and the store's views, which read them."""

from __future__ import annotations

import re
from pathlib import Path


def rank_dir(rank: int | None) -> str:
    # Unpadded: DuckDB, Arrow and Spark then infer an integer partition column.
    return f"rank={rank}" if rank is not None and rank >= 0 else "rank=-1"


def part_path(parts: Path, table: str, rank: int | None, rid: str) -> Path:
    return parts / f"table={table}" / rank_dir(rank) / f"{rid}.parquet"


_PART_RANK = re.compile(r"table=[^/=]+/rank=(-?[0-9]+)/[^/=]+\.parquet")


def part_rank(rel: str) -> int | None:
    """The rank a part's folder names (rank_dir), from its path relative to the parts folder;
    None for a path part_path does not make."""
    m = _PART_RANK.fullmatch(rel)
    return int(m[1]) if m else None
