"""The Python API for notebooks and scripts (in the spirit of HTA's one facade).

    import orchestrator as orch
    rep = orch.analyze(["runs/x/exports"], layout="dp=2,pp=2")   # -> Report (pydantic)
    rep.findings[0].title, rep.rank(1).nccl_wait_ms
    st = orch.open_store("runs/x/profile.duckdb")
    st.table("kernels")                     # pyarrow.Table
    st.sql("SELECT rank, count(*) FROM nvtx GROUP BY rank").fetchall()
    st.view("rank_metrics")                 # any analysis view (metrics/sql/), as pyarrow

Everything here calls the same stage modules the CLI calls.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import duckdb

from orchestrator.analyze.model_report import Report
from orchestrator.metrics.engine import Options, check_regex, run_sql
from orchestrator.metrics.engine import attach_store as _attach
from orchestrator.sqltext import execute


def analyze(paths: Iterable[str | Path], *, layout: str | None = None, out: str | Path | None = None,
            workers: int | None = None, **options: Any) -> Report:
    """Collect the reports/exports under `paths` into a store (in `out`, else a temp dir) and
    return the cross-rank `Report`. `options` are `metrics.engine.Options` fields
    (gap_ms, steps=(a, b), steps_from, microbatches, top_gaps)."""
    from orchestrator.analyze.build import build_report
    from orchestrator.collect.collect import collect
    from orchestrator.layout import Layout

    opts = Options(**options)
    check_regex(opts.steps_from)
    with tempfile.TemporaryDirectory(prefix="orch-analyze-") as tmp:
        dest = Path(out) if out else Path(tmp)
        res = collect([Path(p) for p in paths], dest, layout=Layout.parse(layout), workers=workers)
        return build_report(res.store, opts)


class Store:
    """A collected store, read-only: raw tables, SQL, and the analysis views."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.con = _attach(self.path)
        self._analysed: Options | None = None

    def sql(self, query: str, params: list | None = None) -> duckdb.DuckDBPyConnection:
        return self.con.execute(query, params or [])

    def table(self, name: str):  # -> pyarrow.Table
        """One store table (kernels, memcpy, memset, cuda_api, nvtx, gpu_metrics, ranks, env, meta...)."""
        names = {r[0] for r in self.con.execute("SELECT table_name FROM information_schema.tables "
                                                "WHERE table_catalog = 'store'").fetchall()}
        if name not in names:
            raise KeyError(f"no table {name!r} in {self.path}; tables: {', '.join(sorted(names))}")
        return self._read(name)

    def view(self, name: str, **options: Any):  # -> pyarrow.Table
        """An analysis view (e.g. rank_metrics, gap_attr, coll, step_gpu), computed on first use."""
        opts = Options(**options)
        if self._analysed != opts:
            run_sql(self.con, opts)
            self._analysed = opts
        try:
            return self._read(name)
        except (duckdb.CatalogException, duckdb.ParserException):
            raise KeyError(f"no analysis view {name!r}; the views are listed in docs/metrics.md") from None

    def _read(self, name: str):  # -> pyarrow.Table
        """Every row of the table or view `name`, named as a bound value (never pasted into SQL)."""
        return execute(self.con, "SELECT * FROM query_table(?::VARCHAR)", [name]).to_arrow_table()

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_store(path: str | Path) -> Store:
    return Store(path)
