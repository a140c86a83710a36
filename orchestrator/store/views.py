"""Event tables that stay in the Parquet parts: a store of the parts route can hold its large
event tables as views over the parts instead of copies, so that after a job the reduce costs
files and ranks, not events (docs/scale.md, "Event tables as views over the parts").

One table says which file holds which report's rows of which table, on which rank and at which
clock offset: `event_parts (tbl, i, path, rank, off, bytes)`, `path` relative to the parts
folder, `i` the file's place in its table's list, `bytes` its size (what a reader checks).
Every read of the parts joins it on the reader's `file_index` (an integer join: cheaper than
one on the file name, and the same wherever the parts folder is now): the views stored in the
store name the folder the reduce read, and `relocate` makes them again in the reader's memory
when the run directory moved with its parts. Alignment moves `event_parts.off`; a view leaves
out the rows that end before they start (finalize counted them from `unfiltered`), and the meta
lists the views that held such rows (`event_views_filtered`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import duckdb

from orchestrator.errors import OrchError
from orchestrator.sqltext import execute, file_literal, quote
from orchestrator.store.map_tables import SUMMARIES, Summary
from orchestrator.store.partpaths import part_rank
from orchestrator.store.tables import TABLES

# The tables that may stay in the parts: those with rows per event (a time column). The
# per-thread and per-GPU tables are small and read often: a copy of them costs less than
# opening their files at every read. NVTX ranges are copied too: the analysis reads a range's
# name back by its rowid (40_gaps.sql), which a view has not. So are the CUDA calls: most
# analysis files read them (launches, syncs, allocations, graph launches, the capture's
# overhead), and a view decodes its parts again at each of those reads, which costs the report
# more than the copy costs the reduce (docs/scale.md, "Real GPU ranks"); unless every report's
# map computed what the analysis reads of them (store/map_tables.py): then the analysis reads
# them only for the ranks no map did, and they stay in the parts, however small their files
# (IF_MAPPED: the timeline reads the few ranks it draws). So do the copies, memsets, OS runtime
# calls and threads, which the analysis reads little of but whose many small files a copy pays for,
# and the map's own large tables (its compute islands: a part per rank, OWN_MAPPED), which the
# analysis reads once, on the rank's own clock (their view moves nothing).
COPIED = ("nvtx", "cuda_api")
OWN_MAPPED: dict[str, Summary] = {s.table: s for s in SUMMARIES if s.own}
IF_MAPPED = ("cuda_api", "memcpy", "memset", "osrt", "threads", *OWN_MAPPED)
VIEWABLE = tuple(name for name, t in TABLES.items() if t.shifted and name not in COPIED)
# What no report reads (the analysis SQL, the timeline, export-trace: tests/test_event_views.py
# holds them to it), kept for the user's own SQL: it stays in the parts whatever its size, as a
# copy of its many small files would cost every reduce for nobody's report.
UNREAD = ("sync",)

# A table stays in the parts where its files hold at least this many rows each on average: a
# view opens and decodes its files at every query that reads it, a copy writes every row once,
# so many small files are worth copying and large ones worth leaving where they are
# (docs/scale.md, "Event tables as views over the parts").
VIEW_MIN_ROWS = 10_000

EVENT_PARTS_DDL = ("CREATE TABLE event_parts (tbl VARCHAR, i BIGINT, path VARCHAR, rank INTEGER, off BIGINT, "
                   "bytes BIGINT)")


def own_ranks(paths: Sequence[str], ranks: Sequence[int]) -> bool:
    """Whether every part's `rank=` folder names the rank the store gave its report (`ranks`, in
    `paths`' order), one part a rank. A part holds the rank its map knew, which its folder names
    (parts.py); the reduce may give another (a duplicate, file order). Where none differs, a
    view takes the rank from the folder names (hive partitioning), and a query that wants a few
    ranks (the critical path's, the timeline's) leaves the other ranks' files unopened; a rank
    from `event_parts`, joined on the file index, filters nothing before every file is read."""
    return len(paths) == len(ranks) == len(set(ranks)) and all(
        part_rank(p) == r for p, r in zip(paths, ranks, strict=True))


def parts_select(table: str, columns: Sequence[tuple[str, str]], shifted: Iterable[str], root: Path,
                 paths: Sequence[str], *, possible_only: bool = False, index: str = "event_parts",
                 own_rank: bool = False) -> str:
    """The rows of `table`'s part files `paths` (relative to `root`, in `index`'s order `i`)
    with the rank identity gave each report and the `shifted` columns moved onto the shared
    clock by its offset, both from `index` joined on the reader's `file_index`; `own_rank`: the
    folders' rank is that rank, one file a rank (own_ranks): the offset is joined on the rank
    (the reader numbers only the files it opens), and left out where nothing moves.
    `possible_only`: without the rows that end before they start (a NULL end or start is kept)."""
    if not paths:
        return "SELECT " + ", ".join(f'CAST(NULL AS {t}) AS "{c}"' for c, t in columns) + " WHERE false"
    moved = set(shifted)
    cols = [("p.rank" if own_rank else "m.rank") + " AS rank" if c == "rank"
            else f'p."{c}" + m.off AS "{c}"' if c in moved else f'p."{c}"' for c, _ in columns]
    # Joined as text (a Path object per part costs more than the rest at thousands of parts),
    # the way Path joins: a path given absolute stays as it is.
    base = str(root)
    listing = ", ".join(file_literal(os.path.join(base, p)) for p in paths)
    where = ' WHERE NOT coalesce(p."end" < p.start, false)' if possible_only else ""
    # The rank from the folder names: a filter on it leaves the other ranks' files unopened.
    hive = "true, hive_types = {'rank': INTEGER}" if own_rank else "false"
    read = f"SELECT {', '.join(cols)} FROM read_parquet([{listing}], hive_partitioning = {hive}) p"
    if own_rank and not moved:
        return read + where
    on = "m.rank = p.rank" if own_rank else "m.i = p.file_index"
    return f"{read} JOIN (SELECT i, rank, off FROM {index} WHERE tbl = '{quote(table)}') m ON {on}{where}"


def view_sql(table: str, root: Path, paths: Sequence[str], *, name: str | None = None, temp: bool = False,
             possible_only: bool = False, index: str = "event_parts", ranks: Sequence[int] | None = None) -> str:
    """CREATE VIEW `name` (default: the table) over `table`'s parts under `root`; `ranks`: the
    store's rank of each part, where known (own_ranks)."""
    own = ranks is not None and "rank=" not in str(root) and own_ranks(paths, ranks)
    if table in OWN_MAPPED:
        body = parts_select(table, OWN_MAPPED[table].columns, (), root, paths, index=index, own_rank=own)
    else:
        t = TABLES[table]
        body = parts_select(table, t.store_columns, t.shifted, root, paths,
                            possible_only=possible_only and t.has_duration, index=index, own_rank=own)
    return f"CREATE OR REPLACE {'TEMP ' if temp else ''}VIEW {name or table} AS {body}"


def choose(candidates: Iterable[str], rows: dict[str, int], files: dict[str, int], min_rows: int,
           mapped: bool = False) -> list[str]:
    """The `candidates` worth a view: VIEWABLE tables with parts holding `min_rows` rows a file
    on average (`rows` and `files`: per table, over the reports reduced), the UNREAD ones that
    have rows, and where every report was `mapped` with its statistics the IF_MAPPED ones that
    have rows (the map's own tables: files), in registry order."""
    wanted = set(candidates)
    if_mapped = [t for t in IF_MAPPED if mapped and (rows.get(t, 0) > 0 or t in OWN_MAPPED)]
    return [t for t in (*TABLES, *OWN_MAPPED) if t in wanted and files.get(t) and (
        t in if_mapped or (t in UNREAD and rows.get(t, 0) > 0)
        or (t in VIEWABLE and rows.get(t, 0) >= min_rows * files[t]))]


def unfiltered(table: str) -> str:
    """The temporary view of every row of a viewed table, impossible ones included (finalize
    counts those on their rank)."""
    return f"{table}_unfiltered"


def table_parts(con: duckdb.DuckDBPyConnection, table: str, index: str = "event_parts") -> list[tuple[str, int]]:
    """`table`'s part files (relative to the parts folder) with their store rank, in their order `i`."""
    return execute(con, f"SELECT path, rank FROM {index} WHERE tbl = ? ORDER BY i", [table]).fetchall()


def create_views(con: duckdb.DuckDBPyConnection, root: Path, tables: Iterable[str], filtered: Iterable[str] = (),
                 *, index: str = "event_parts") -> None:
    """The viewed `tables` over their parts under `root`, from `index` (the reduce's own, or a
    reader's attached store's); those in `filtered` leave out their rows that end before they
    start (a filter reads two more columns at every query, so only where finalize found such
    rows)."""
    for table in tables:
        listed = table_parts(con, table, index)
        con.execute(view_sql(table, root, [p for p, _ in listed], possible_only=table in set(filtered), index=index,
                             ranks=[r for _, r in listed]))


def viewed(meta: dict[str, str], key: str = "event_views") -> list[str]:
    """The store's tables that are views over the parts (its meta says; `key`
    event_views_filtered: those that leave impossible rows out), in registry order."""
    names = set(filter(None, meta.get(key, "").split(",")))
    return [t for t in (*TABLES, *OWN_MAPPED) if t in names]


def _unlike(root: Path, parts: list[tuple[str, int]]) -> str | None:
    """Why the parts under `root` are not those the store was made from (a file missing, or of
    another size: a report mapped again since, whose rows the store's offsets do not fit), or
    None."""
    for p, size in parts:
        try:
            now = (root / p).stat().st_size
        except OSError:
            return f"{p} is not there"
        if size is not None and now != size:
            return f"{p} changed since the store was made ({size} -> {now} bytes)"
    return None


def relocate(con: duckdb.DuckDBPyConnection, store: Path, meta: dict[str, str]) -> None:
    """Make the attached `store`'s viewed tables readable by `con`, whose search path puts its
    own memory first: over the parts beside the store (the run directory moved or was copied
    whole: views made again in memory), else where the reduce read them (the store's own
    views); otherwise one line that names the part that is missing or changed, and the fix."""
    tables = viewed(meta)
    if not tables:
        return
    parts = execute(con, "SELECT path, bytes FROM store.event_parts WHERE list_contains(?, tbl)",
                    [tables]).fetchall()
    was = Path(meta["parts"])
    here = Path(store).resolve().parent / meta["parts_from_store"]
    roots = [r for r in dict.fromkeys((here, was)) if r.is_dir()] or [was]
    why = {r: _unlike(r, parts) for r in roots}
    root = next((r for r in roots if why[r] is None), None)
    if root is None:
        raise OrchError(f"{store}: its event tables ({', '.join(tables)}) are read from the Parquet parts in "
                        f"{roots[0]}, and {why[roots[0]]}; put the run's parts/ back beside the store, or re-run "
                        "`orch collect` (add --copy-events for a store that holds its events and can be moved alone)")
    if root == was:
        return
    create_views(con, root, tables, viewed(meta, "event_views_filtered"), index="store.event_parts")
