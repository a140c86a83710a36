"""The analysis SQL modules' headers, read as declarations (after Perfetto's SQL standard
library: every module says what it reads and what it provides, and a checker holds it to it).

Each `metrics/sql/NN_*.sql` opens with a comment block; four of its lines are machine-read:

    -- Map: per rank (map_done)           (optional: the file is the map's, run per rank)
    -- Reads: gpu_ops, win (any note in parentheses), params.
    -- Writes: steps, step_source.        (optional: earlier modules' tables it adds rows to)
    -- Provides:
    --   name(col, col, ...)  what it is, continued on lines indented deeper
    --   _helper(col, ...)    a leading `_`: private to this file (dropped once it ran: disposable)
    --   mapped(rank INTEGER, n BIGINT, ...)  columns with their types: what the map writes

`Reads` lists store tables, `params` and earlier modules' public names; it may wrap onto the
next comment lines and ends with a period. A `Provides` entry starts at three spaces after
`--`; its parentheses hold the columns of a table or view, or the parameters of a macro. The
block ends at the first line indented less. A table the map writes for the reduce
(store/map_tables.py) gives each column its type (INTEGER, BIGINT, DOUBLE, VARCHAR, BOOLEAN):
the header is the one declaration of its columns, which the store and the map read from it.
A `Map: per rank` file computes what needs one rank's rows alone: the map runs it on its rank,
and the analysis runs it only over the ranks whose map it cannot take (metrics/rankpass.py), so
that it reads no other rank's rows. The name in parentheses is its key, the ranks whose map is
taken, or that need nothing of the file (map_ranks when none is given). Where no rank is left to
it, its tables are made empty: one that a reader binds with its types (a name a string function
reads) gives them too.
The scheduler builds its DAG from these declarations (sqlrun.py), tests/test_sql_modules.py
checks them against what DuckDB runs, and scripts/gen_metrics_doc.py turns them into
docs/metrics.md.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# The analysis SQL modules (metrics/sql/NN_*.sql): run by the analysis, and read by the store
# for the columns of the tables the map writes.
SQL_DIR = Path(__file__).resolve().parent / "metrics" / "sql"

_NOTE = re.compile(r"\([^()]*\)")  # `ranks (untraced)`: a note on a read, not part of its name
_ENTRY = re.compile(r"^--   (\w+)\s*\(")
_NAME = re.compile(r"^\w+$")
_TYPED = re.compile(r"^(\w+) (INTEGER|BIGINT|DOUBLE|VARCHAR|BOOLEAN)$")


class HeaderError(ValueError):
    """A module header the parser cannot read; the message names the file and the line."""


@dataclass(frozen=True)
class Provided:
    """One name a module creates: its columns (or macro parameters) and its documentation."""

    name: str
    columns: tuple[str, ...]
    doc: str
    types: tuple[str, ...] = ()  # the columns' types, where the header gives them (every column's)

    @property
    def private(self) -> bool:
        return self.name.startswith("_")


@dataclass(frozen=True)
class Module:
    """One SQL file's declaration: what it reads, which earlier tables it adds rows to, what it
    provides; `sql` is the whole file (header included) as DuckDB runs it."""

    file: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    provides: tuple[Provided, ...]
    sql: str
    per_rank: str | None = None  # `-- Map: per rank (key)`: the key

    @property
    def public(self) -> tuple[Provided, ...]:
        return tuple(p for p in self.provides if not p.private)

    @property
    def names(self) -> frozenset[str]:
        return frozenset(p.name for p in self.provides)


def header(sql: str) -> list[str]:
    """The file's leading comment lines (the header ends at the first line of SQL)."""
    out = []
    for line in sql.splitlines():
        if not line.startswith("--"):
            break
        out.append(line.rstrip())
    return out


def _name_list(text: str, file: str, what: str) -> tuple[str, ...]:
    text = _NOTE.sub("", text).strip()
    if text in ("", "nothing"):
        return ()
    names = tuple(n.strip() for n in text.split(","))
    bad = [n for n in names if not _NAME.match(n)]
    if bad:
        raise HeaderError(f"{file}: {what} {bad} are not names (write `a, b (note), c.`)")
    return names


def _list_line(lines: list[str], key: str, file: str) -> tuple[str, ...]:
    """The names after `-- key:` up to the period, wrapping onto the next comment lines (what
    follows the period, e.g. `Provides:` of the short form `-- Reads: a. Provides:`, is not a name)."""
    for i, line in enumerate(lines):
        if line.startswith(f"-- {key}:"):
            text = line[len(f"-- {key}:"):]
            j = i
            while "." not in _NOTE.sub("", text):
                j += 1
                if j == len(lines):
                    raise HeaderError(f"{file}: `-- {key}:` list never ends with a period")
                text += " " + lines[j][2:]
            names = _NOTE.sub(lambda m: m.group(0).replace(".", ""), text).partition(".")[0]
            return _name_list(names, file, key)
    return ()


def _provides(lines: list[str], file: str) -> tuple[Provided, ...]:
    start = next((i for i, s in enumerate(lines) if s.endswith("Provides:")), None)
    if start is None:
        raise HeaderError(f"{file}: no `-- Provides:` block")
    entries: list[list[str]] = []
    for line in lines[start + 1:]:
        if _ENTRY.match(line):
            entries.append([line[5:]])
        elif line.startswith("--    ") and entries:
            entries[-1].append(line[2:].strip())
        elif line.startswith("--   "):
            raise HeaderError(f"{file}: `{line[5:45]}...`: an entry is `name(col, ...)  doc`")
        else:
            break
    if not entries:
        raise HeaderError(f"{file}: `-- Provides:` lists nothing (entries: `--   name(col, ...)  doc`)")
    out = []
    for entry in entries:
        text = " ".join(entry)
        name, _, rest = text.partition("(")
        cols, close, doc = rest.partition(")")
        if not close or "(" in cols:
            raise HeaderError(f"{file}: `{text[:60]}...`: columns are plain names in one pair of parentheses")
        names, types = _columns(cols, file, name.strip())
        out.append(Provided(name.strip(), names, " ".join(doc.split()), types))
    return tuple(out)


def _columns(text: str, file: str, name: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(names, types) of a Provides entry's columns: plain names, or each with its type."""
    if not text.strip():
        return (), ()
    parts = [" ".join(c.split()) for c in _NOTE.sub("", text).split(",")]
    typed = [_TYPED.match(c) for c in parts]
    if any(typed):
        if not all(typed):
            raise HeaderError(f"{file}: {name} columns {parts}: give every column its type or none "
                              "(`rank INTEGER, n BIGINT`)")
        return tuple(m.group(1) for m in typed if m), tuple(m.group(2) for m in typed if m)
    return _name_list(text, file, f"{name} columns"), ()


def parse(file: str, sql: str) -> Module:
    """One module's declaration from its header (HeaderError when it does not follow the form)."""
    lines = header(sql)
    if not any(s.startswith("-- Reads:") for s in lines):
        raise HeaderError(f"{file}: no `-- Reads:` line (write `-- Reads: nothing.` when it reads nothing)")
    return Module(file, _list_line(lines, "Reads", file), _list_line(lines, "Writes", file),
                  _provides(lines, file), sql, _map_key(lines, file))


def _map_key(lines: list[str], file: str) -> str | None:
    """The key of a `-- Map: per rank` file (`map_ranks` unless its parentheses name another)."""
    for line in lines:
        m = re.fullmatch(r"-- Map: per rank(?: \((\w+)\))?", line)
        if m:
            return m.group(1) or "map_ranks"
        if line.startswith("-- Map:"):
            raise HeaderError(f"{file}: `{line}`: write `-- Map: per rank` or `-- Map: per rank (key)`")
    return None


def parse_all(files: Iterable[tuple[str, str]]) -> list[Module]:
    """(file name, SQL) in execution order -> their declarations, in that order."""
    return [parse(name, sql) for name, sql in files]


@functools.cache
def analysis_modules() -> tuple[Module, ...]:
    """Every file of SQL_DIR in execution order (its name's), read and parsed once a process:
    the analysis plans them, the store takes the map tables' columns from them."""
    return tuple(parse_all((f.name, f.read_text()) for f in sorted(SQL_DIR.glob("*.sql"))))


_CREATED = re.compile(r"^CREATE (?:OR REPLACE )?(MACRO|TABLE|VIEW) (\w+)", re.I)
_WORD = re.compile(r"\w+")


@functools.cache
def created(sql: str) -> tuple[tuple[str, str, str, str], ...]:
    """What each statement of a file creates: (MACRO | TABLE | VIEW, name, the statement as
    written, its code()). Tokenizing is most of the plan's time, so a file is read once a process."""
    import duckdb

    return tuple((x.group(1).upper(), x.group(2), st.query.strip(), q) for st in duckdb.extract_statements(sql)
                 if (x := _CREATED.match(q := code(st.query))))


def disposable(m: Module) -> tuple[tuple[str, str], ...]:
    """(TABLE | VIEW, name) of the file's private tables and views that nothing can read once
    the file has run: private names are its own, so only its public views and macros read them
    later, directly or through its other private views and macros. The analysis drops them
    then (sqlrun.execute), so that a large helper (each call of a thread, each GPU op clipped to
    the window) does not hold memory for the rest of the report."""
    made = [(kind, name, set(_WORD.findall(q))) for kind, name, _, q in created(m.sql)]
    kept = {name for kind, name, _ in made if kind in ("VIEW", "MACRO") and not name.startswith("_")}
    grew = True
    while grew:
        more = {w for kind, name, words in made if name in kept and kind in ("VIEW", "MACRO") for w in words}
        grew = not more <= kept
        kept |= more
    return tuple(dict.fromkeys((kind, name) for kind, name, _ in made
                               if kind != "MACRO" and name.startswith("_") and name not in kept))


_TOKEN_END = re.compile(r"\s|--|/\*")


def code(sql: str) -> str:
    """`sql` as DuckDB reads it, without its comments and layout: its tokens, one space apart.
    What a digest of the analysis SQL hashes, so that a module's header or comment edited
    leaves maps made with the same statements valid. DuckDB's tokenizer gives where each token
    starts and skips comments; a token ends at its closing quote (a string or a quoted name,
    whose spaces are its own) or at the first space or comment after it."""
    import duckdb

    starts = duckdb.tokenize(sql)
    out = []
    for (at, _), end in zip(starts, [s for s, _ in starts[1:]] + [len(sql)], strict=True):
        piece = sql[at:end]
        quote = piece[0] if piece[0] in "'\"" else None
        if quote is None:
            out.append(_TOKEN_END.split(piece, maxsplit=1)[0])
            continue
        close = 1
        while (close := piece.index(quote, close)) + 1 < len(piece) and piece[close + 1] == quote:
            close += 2  # a doubled quote inside
        out.append(piece[:close + 1])
    return " ".join(out)
