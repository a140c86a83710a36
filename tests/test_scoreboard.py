"""The scoreboard (scripts/scoreboard.py) over every real capture: a miss fails unless
tests/scoreboard_known.json lists it with its reason, and a listed miss that now hits fails too
(take it off the list). Every real capture in tests/fixtures has a truth file, and
docs/scoreboard.md shows the verdicts the board gives today."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.stores import Stores

FIXTURES = REPO / "tests" / "fixtures"
TRUTH = FIXTURES / "truth"
KNOWN = REPO / "tests" / "scoreboard_known.json"


def _truths() -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted(TRUTH.glob("*.json"))]


@pytest.fixture(scope="module")
def board(stores: Stores, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The board as the script prints it, judged from the session's reports of every case
    (tests/stores.py makes them as the script does, once for every module that reads them)."""
    out = tmp_path_factory.mktemp("board") / "board.json"
    kept = stores.cases([t["case"] for t in _truths()])
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "scoreboard.py"), "--reports", str(kept),
                        "--json", str(out)], capture_output=True, text=True, check=False, cwd=REPO)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return {r["case"]: r for r in json.loads(out.read_text())}


@pytest.mark.replay
def test_every_miss_is_known_with_its_reason_and_every_known_miss_still_misses(board) -> None:
    known = json.loads(KNOWN.read_text())
    assert all(isinstance(why, str) and len(why) > 20 for why in known.values()), "a known miss needs its reason"
    assert not set(known) - set(board), f"known misses of no case: {set(known) - set(board)}"
    new = {c: r["missed"] for c, r in board.items() if r["verdict"] != "hit" and c not in known}
    fixed = [c for c, r in board.items() if r["verdict"] == "hit" and c in known]
    assert not new, f"misses not in tests/scoreboard_known.json: {json.dumps(new, indent=1)}"
    assert not fixed, f"now hits: take them off tests/scoreboard_known.json: {fixed}"


@pytest.mark.replay
def test_the_script_runs_orch_itself_and_judges_again_from_what_it_kept(board, tmp_path: Path) -> None:
    """Without --reports the script runs orch (a small case here): the same row as the board's,
    and --reports over what --keep left gives that row again without running orch."""
    def rows(*args: str) -> list[dict]:
        out = tmp_path / f"{len(args)}.json"
        p = subprocess.run([sys.executable, str(REPO / "scripts" / "scoreboard.py"), "--case", "gpu_e2e-ok", *args,
                            "--json", str(out)], capture_output=True, text=True, check=False, cwd=REPO)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        return [{k: v for k, v in r.items() if k != "seconds"} for r in json.loads(out.read_text())]

    ran = rows("--keep", str(tmp_path / "kept"))
    assert (tmp_path / "kept" / "gpu_e2e-ok" / "report.json").is_file()
    assert ran == rows("--reports", str(tmp_path / "kept"))
    assert ran == [{k: v for k, v in board["gpu_e2e-ok"].items() if k != "seconds"}]


@pytest.mark.replay
def test_the_docs_show_the_verdicts_the_board_gives(board) -> None:
    """docs/scoreboard.md is generated (`scripts/scoreboard.py --markdown docs/scoreboard.md`): its
    verdicts are today's, so users read how often orch is right, and on what."""
    rows = re.findall(r"^\| (\S+) \|.*\| (hit|miss|error) \|[^|]*\|$", (REPO / "docs" / "scoreboard.md").read_text(),
                      re.M)
    assert dict(rows) == {c: r["verdict"] for c, r in board.items()}, \
        "docs/scoreboard.md is stale: python scripts/scoreboard.py --markdown docs/scoreboard.md"


@pytest.mark.fast
def test_every_real_capture_has_a_truth_file_and_every_truth_file_a_capture() -> None:
    """Each real export in tests/fixtures (gzip or xz, outside the truth folder) is the input of a
    case, and each case's input exists; a truth names its cause, root, outcome and how each
    number was found."""
    truths = _truths()
    assert len(truths) >= 25
    used: set[Path] = set()
    for t in truths:
        spec = t["input"]
        files = (sorted((FIXTURES / spec["run"] / "exports").glob("*.sqlite.*")) if "run" in spec
                 else [FIXTURES / f for f in spec["exports"]])
        assert files and all(f.is_file() for f in files), t["case"]
        used |= {f.resolve() for f in files}
        assert t["how"].get("root") or t["cause"] in ("none", "cancel"), f"{t['case']}: how was the root found?"
        for key in ("saving_ms", "saving_unprofiled_ms", "steps", "peak_bytes"):
            assert t.get(key) is None or t["how"].get(key), f"{t['case']}: how was {key} found?"
    exports = {f.resolve() for f in FIXTURES.rglob("*.sqlite.*") if f.suffix in (".gz", ".xz")}
    assert not exports - used, f"real captures without a truth file: {sorted(map(str, exports - used))[:10]}"
