"""Python values as DuckDB SQL literals, and parameterized queries run without DuckDB's Python
value binding: the one place orch turns a value into SQL text.

Why not `con.execute(sql, params)`: DuckDB's Python client imports pandas and numpy (and pyarrow
with them) the first time it binds a non-NULL Python value: a fixed cost on every `orch report`
and `orch analyze`, more than the analysis SQL of a small job (docs/benchmarks-code.md).
`execute` keeps the query parameterized instead: the statement is PREPAREd with its
`?` placeholders and EXECUTEd with the values as typed literals, so a value can never change
the statement's shape. Only None, bool, int, float, str and lists of them are accepted.
The statements DuckDB cannot prepare (SET, ATTACH, DETACH, LOAD) go through `set_option`,
`attach`, `detach` and `load`: their values quoted here, their names checked.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator import numbers

if TYPE_CHECKING:
    import duckdb

_STMT = "orch_q"  # one prepared statement per connection, replaced by the next


def quote(s: str) -> str:
    """The body of a single-quoted SQL string (ATTACH, LOAD, COPY and SET take no parameters)."""
    return s.replace("'", "''")


# Each glob character of a path as a class that matches only itself (file_literal).
_GLOB_CLASSES = str.maketrans({c: f"[{c}]" for c in "*?["})


def file_literal(path: object) -> str:
    """A file path as the quoted literal a DuckDB reader (read_parquet) takes: those expand a
    path with `*`, `?` or `[` as a glob, so each such character is written as a class that
    matches only itself (a run directory named `run[1]` reads its own files, not `run1`'s)."""
    return "'" + quote(str(path).translate(_GLOB_CLASSES)) + "'"


def literal(v: object) -> str:
    """A DuckDB SQL literal for None, bool, int, float, str, or a list/tuple of those."""
    if v is None:
        return "NULL"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(int(v))
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else "NULL"
    if isinstance(v, list | tuple):
        return "[" + ", ".join(map(literal, v)) + "]"
    if not isinstance(v, str):
        raise TypeError(f"no SQL literal for {type(v).__name__}")
    text = numbers.text(v) or ""
    # NUL cannot sit inside a literal; chr(0) joins the pieces.
    return " || chr(0) || ".join("'" + quote(part) + "'" for part in text.split("\x00"))


def execute(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[object] | None = None
            ) -> duckdb.DuckDBPyConnection:
    """`con.execute(sql, params)` for one SELECT with `?` placeholders, through PREPARE/EXECUTE
    with literal arguments (see the module docstring for why)."""
    if not params:
        return con.execute(sql)
    con.execute(f"PREPARE {_STMT} AS {sql}")
    return con.execute(f"EXECUTE {_STMT}({', '.join(map(literal, params))})")


_OPTION = re.compile(r"[a-z_]+")
_ALIAS = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def set_option(con: duckdb.DuckDBPyConnection, name: str, value: int | str) -> None:
    """`SET name = value` (SET takes no parameters): the value as a literal (a path as it is,
    undecodable bytes included), the name one of DuckDB's option names."""
    if not _OPTION.fullmatch(name):
        raise ValueError(f"not a DuckDB option name: {name!r}")
    con.execute(f"SET {name} = " + (f"'{quote(value)}'" if isinstance(value, str) else literal(value)))


def attach(con: duckdb.DuckDBPyConnection, path: object, alias: str, *, sqlite: bool = False,
           read_only: bool = False) -> None:
    """`ATTACH 'path' AS alias`, a DuckDB file or (`sqlite`) an nsys export, read-only or not
    (ATTACH takes no parameters: the path is a quoted literal, the alias a plain name)."""
    if not _ALIAS.fullmatch(alias):
        raise ValueError(f"not a database alias: {alias!r}")
    opts = ", ".join((["TYPE sqlite"] if sqlite else []) + (["READ_ONLY"] if read_only else []))
    con.execute(f"ATTACH '{quote(str(path))}' AS {alias}" + (f" ({opts})" if opts else ""))


def detach(con: duckdb.DuckDBPyConnection, alias: str) -> None:
    """`DETACH DATABASE IF EXISTS alias`."""
    if not _ALIAS.fullmatch(alias):
        raise ValueError(f"not a database alias: {alias!r}")
    con.execute(f"DETACH DATABASE IF EXISTS {alias}")


def load(con: duckdb.DuckDBPyConnection, path: object) -> None:
    """`LOAD 'path'`: an extension from a file (LOAD takes no parameters)."""
    con.execute(f"LOAD '{quote(str(path))}'")
