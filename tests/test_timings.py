"""`--timings`: where one `orch analyze` spent its time, phase by phase, on real exports."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from orchestrator.sqlmodules import SQL_DIR
from tests.conftest import run_orch

pytestmark = pytest.mark.replay

REAL = Path(__file__).parent / "fixtures" / "real"


def test_analyze_timings_cover_collect_sql_and_report(tmp_path: Path) -> None:
    files = [str(f) for f in sorted(REAL.glob("item_sync_r*_*.sqlite.gz"))]
    p = run_orch("analyze", *files, "--timings", "--html", str(tmp_path / "r.html"))
    assert p.returncode == 0, p.stderr
    rows = {m[1].strip(): float(m[2]) for m in re.finditer(r"^(\S.*?)\s+([0-9.]+) s(?:  x\d+)?$", p.stderr, re.M)}
    sql_files = sorted(f.name for f in SQL_DIR.iterdir() if f.name.endswith(".sql"))
    assert {f"analyze: {f}" for f in sql_files} <= rows.keys()  # every file, run concurrently
    for name in ("collect: build store (total)", "analyze: SQL (wall)", "report: metrics", "report: tables",
                 "report: rules", "report: timeline extras", "report: terminal", "report: write html"):
        assert name in rows, name
    wall = rows["wall (since start)"]
    assert rows["collect: build store (total)"] + rows["analyze: SQL (wall)"] <= wall
    # the files overlap in time: their summed time can exceed the SQL's wall time, never
    # fall short of the longest one
    assert rows["analyze: SQL (wall)"] >= max(rows[f"analyze: {f}"] for f in sql_files)
