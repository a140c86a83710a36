"""`orch analyze` analyses the store on the collect's own DuckDB connection while the store's
checkpoint runs (collect.collecting, ingest.writing_store, engine.on_writer), instead of
checkpointing, closing and reopening the file first. It must give what `orch collect` then
`orch report` give, on real H200 captures (one with NVTX steps, one whose iterations are
inferred), with the checkpoint in the background (a small store) and first (past
BACKGROUND_CHECKPOINT_MAX): the same store, table by table, and the same report.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from typing import ClassVar

import pytest

from orchestrator.cli import main
from orchestrator.collect import ingest, store
from tests.conftest import store_differences

pytestmark = pytest.mark.replay

REAL = Path(__file__).parent / "fixtures" / "real"


def _unpacked(case: str, dest: Path) -> Path:
    """The real capture `case` (tests/fixtures/real), its exports decompressed into `dest`."""
    dest.mkdir()
    for gz in sorted(REAL.glob(f"{case}_r*.sqlite.gz")):
        with gzip.open(gz, "rb") as fi, open(dest / gz.name.removesuffix(".gz"), "wb") as fo:
            shutil.copyfileobj(fi, fo)
    return dest


class _Spy(store.Checkpoint):
    """The real checkpoint, remembering whether it was asked to run in the background."""

    seen: ClassVar[list[bool]] = []

    def __init__(self, con, background: bool) -> None:  # type: ignore[no-untyped-def]
        _Spy.seen.append(background)
        super().__init__(con, background)


@pytest.mark.parametrize("case", ["ddp_slowrank", "healthy"])  # NVTX steps; iterations inferred
@pytest.mark.parametrize("background", [True, False])
def test_analyze_on_the_writer_equals_collect_then_report(case: str, background: bool, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    src = _unpacked(case, tmp_path / "src")
    monkeypatch.setattr(ingest, "Checkpoint", _Spy)
    if not background:
        monkeypatch.setattr(ingest, "BACKGROUND_CHECKPOINT_MAX", 0)
    _Spy.seen = []
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["analyze", str(src), "--out", str(a), "--json", str(tmp_path / "a.json"),
                 "--html", str(tmp_path / "a.html")]) == 0
    assert _Spy.seen == [background]  # small stores: in the background; past the limit: first
    assert main(["collect", "--from", str(src), "--out", str(b)]) == 0
    assert _Spy.seen == [background, False]  # `orch collect` never leaves it running
    # `orch report` takes the collect's --out folder for its store
    assert main(["report", str(b), "--json", str(tmp_path / "b.json"),
                 "--html", str(tmp_path / "b.html")]) == 0
    capsys.readouterr()

    diff = store_differences(a / "profile.duckdb", b / "profile.duckdb")
    assert {t: d for t, d in diff.items() if d[1] or d[2]} == {}
    assert diff["kernels"][0] > 0 and diff["cuda_api"][0] > 0
    assert not list(a.glob("*.wal")) and not list(a.glob(".profile.duckdb.tmp-*"))

    ra, rb = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "ab")
    assert ra.pop("store") == str(a / "profile.duckdb") and rb.pop("store") == str(b / "profile.duckdb")
    assert ra == rb
    assert ra["findings"] and ra["window"]["step_source"].startswith(
        "inferred" if case == "healthy" else "numbered NVTX")
    ha = (tmp_path / "a.html").read_text().replace(str(a), "STORE")
    hb = (tmp_path / "b.html").read_text().replace(str(b), "STORE")
    assert ha == hb


def test_analyze_over_parts_gives_the_same_report(tmp_path: Path, capsys) -> None:
    """`orch analyze --parts` has no writer to share (the reduce builds the store in its own
    connection): it reports from the finished store, with the same answer."""
    src = _unpacked("healthy", tmp_path / "src")
    for name, extra in (("a", []), ("p", ["--parts"])):
        assert main(["analyze", str(src), "--out", str(tmp_path / name), "--json", str(tmp_path / f"{name}.json"),
                     *extra]) == 0
    capsys.readouterr()
    assert (tmp_path / "p" / "parts").is_dir()  # the map/reduce path ran
    ra, rp = (json.loads((tmp_path / f"{x}.json").read_text()) for x in "ap")
    ra.pop("store"), rp.pop("store")
    assert ra == rp and ra["findings"]
