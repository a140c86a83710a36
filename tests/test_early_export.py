"""The nsys exports start before orch loads pydantic, DuckDB and rich (gather.early_exports),
the collect takes them over instead of exporting again, and a command that fails while they
run kills them and keeps nothing. Real nsys 2022.4, real .nsys-rep captures.

Which modules are loaded when an export starts is read with a Python audit hook on
`subprocess.Popen` in the real CLI process: no timing, no race.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from tests.conftest import capture_cpu, run_orch

pytestmark = [pytest.mark.jobs, pytest.mark.nsys]

HEAVY = ("duckdb", "pydantic", "rich.console")

# Runs the real CLI in a fresh interpreter, recording for every `nsys export` it starts which
# of HEAVY were loaded at that moment.
DRIVER = """
import json, sys
heavy, args, log = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
seen = []
def hook(event, what):
    if event == "subprocess.Popen" and "export" in list(map(str, what[1] or ())):
        seen.append({"loaded": [m for m in heavy if m in sys.modules], "argv": list(map(str, what[1]))})
sys.addaudithook(hook)
from orchestrator.cli import main
code = main(args)
open(log, "w").write(json.dumps(seen))
sys.exit(code)
"""


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory, nsys: str) -> Path:
    """Two ranks of a small NVTX-annotated loop, captured by nsys 2022.4 on the CPU."""
    reps = tmp_path_factory.mktemp("early") / "reports"
    reps.mkdir()
    for rank in (0, 1):
        capture_cpu(nsys, "import nvtx, time\nfor i in range(3):\n    with nvtx.annotate(f'step {i}'):\n"
                    "        time.sleep(0.002)\n", reps / f"early_3_r{rank}_h.{100 + rank}")
    return reps


def _drive(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    log = tmp_path / "popen.json"
    p = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(HEAVY), json.dumps(list(args)), str(log)],
                       capture_output=True, text=True, timeout=600, check=False)
    return p, json.loads(log.read_text()) if log.exists() else []


def test_exports_start_before_the_heavy_imports_and_are_taken_over(reports: Path, tmp_path: Path,
                                                                   nsys: str) -> None:
    out = tmp_path / "run"
    p, seen = _drive(tmp_path, "collect", "--from", str(reports), "--out", str(out), "--nsys", nsys)
    assert p.returncode == 0, p.stderr
    # Both ranks' exports (2 workers on 2 reports) started with none of the heavy modules loaded,
    # asking for the options of nsys 2024+.
    early = [s for s in seen if not s["loaded"]]
    assert len(early) == 2 and {s["argv"][-1] for s in early} == {str(f) for f in reports.glob("*.nsys-rep")}
    assert all("--include-json=true" in s["argv"] and "--tables" in s["argv"] for s in early)
    # nsys 2022.4 rejects them: each report is asked again without the rejected option(s) -
    # by the collect, which took the early export over instead of starting its own (which
    # would ask for --include-json again).
    later = [s for s in seen if s["loaded"]]
    assert not any("--include-json=true" in s["argv"] for s in later)
    for rep in reports.glob("*.nsys-rep"):
        runs = [s["argv"] for s in later if s["argv"][-1] == str(rep)]
        assert 1 <= len(runs) <= 2 and "--tables" not in runs[-1]
    con = duckdb.connect(str(out / "profile.duckdb"), read_only=True)
    assert con.execute("SELECT rank, count(*) FROM nvtx WHERE text LIKE 'step %' GROUP BY 1 ORDER BY 1"
                       ).fetchall() == [(0, 3), (1, 3)]
    assert sorted(f.name for f in (out / "exports").iterdir()) == ["early_3_r0_h.100.sqlite",
                                                                    "early_3_r1_h.101.sqlite"]


def _ours(marker: str) -> list[str]:
    """Command lines of live processes that mention `marker` (an nsys left running)."""
    found = []
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if d.name.isdigit() and int(d.name) != os.getpid() and marker in cmd:
            found.append(cmd)
    return found


@pytest.mark.parametrize("bad, needle", [(["--layout", "pp=0"], "--layout"),
                                         (["--steps-from", "("], "--steps-from")])
def test_a_bad_option_found_while_exporting_keeps_nothing(reports: Path, tmp_path: Path, nsys: str,
                                                          bad: list[str], needle: str) -> None:
    """The options checked after the exports started fail as before, in one line; the
    exports are killed and nothing is left: no --out folder, no temp file, no nsys."""
    out = tmp_path / "new" / "run"
    p, seen = _drive(tmp_path, "analyze", str(reports), "--out", str(out), "--nsys", nsys, *bad)
    assert p.returncode == 2 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert len([s for s in seen if not s["loaded"]]) == 2  # they had started
    assert not (tmp_path / "new").exists()
    assert sorted(f.name for f in reports.iterdir()) == ["early_3_r0_h.100.nsys-rep", "early_3_r1_h.101.nsys-rep"]
    assert _ours(str(out)) == []


def test_collect_without_out_leaves_no_empty_folder_on_a_bad_layout(reports: Path, tmp_path: Path,
                                                                     nsys: str) -> None:
    p = run_orch("collect", "--from", str(reports), "--nsys", nsys, "--layout", "tp=x", cwd=tmp_path)
    assert p.returncode == 2 and "--layout" in p.stderr, p.stderr
    assert list(tmp_path.iterdir()) == []
