"""The GPU path, on exports orch itself produced on 2 H200s (tests/fixtures/gpu_e2e): the
planted slow rank and heavy stage are found, the healthy run is healthy, and the numbers
match the independent computation."""

from __future__ import annotations

import gzip
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from orchestrator.analyze.build import build_report
from orchestrator.collect.collect import collect
from orchestrator.collect.identity import Layout
from orchestrator.metrics.engine import Options
from tests.independent import Rank

pytestmark = pytest.mark.replay

FIX = Path(__file__).parent / "fixtures" / "gpu_e2e"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, list[Path]]]:
    out = {}
    for run, layout in (("ddp", Layout(tp=1, pp=1, dp=2, world_size=2, known=True)),
                        ("pp", Layout(tp=1, pp=2, dp=1, world_size=2, known=True)),
                        ("ok", Layout(tp=1, pp=1, dp=2, world_size=2, known=True))):
        d = tmp_path_factory.mktemp(run)
        files = []
        for gz in sorted(FIX.glob(f"{run}_r*.sqlite.gz")):
            dest = d / "in" / gz.name.removesuffix(".gz")
            dest.parent.mkdir(exist_ok=True)
            with gzip.open(gz, "rb") as fi, open(dest, "wb") as fo:
                shutil.copyfileobj(fi, fo)
            files.append(dest)
        res = collect([d / "in"], d / "run", layout=layout)
        assert res.ok_ranks == [0, 1]
        out[run] = (build_report(res.store, Options()).model_dump(), files)
    return out


def test_ddp_slow_rank_found(runs) -> None:
    rep, _ = runs["ddp"]
    top = rep["findings"][0]
    assert top["kind"] == "straggler" and top["ranks"] == [1] and "data_load" in top["title"]
    assert "data_loader_stall" in [f["kind"] for f in rep["findings"]]
    r = {x["rank"]: x for x in rep["ranks"]}
    assert r[0]["nccl_wait_ms"] > 0.9 * r[0]["comm_ms"]  # rank 0 mostly waits for rank 1
    assert max(r[1]["gaps_by_range_ms"], key=r[1]["gaps_by_range_ms"].get) == "data_load"


def test_ddp_capture_range_metrics_and_pytorch_ranges(runs, tmp_path: Path) -> None:
    import duckdb

    _, files = runs["ddp"]
    res = collect([files[0].parent], tmp_path, layout=Layout())
    con = duckdb.connect(str(res.store), read_only=True)
    steps = {t for (t,) in con.execute("SELECT DISTINCT text FROM nvtx WHERE text LIKE 'step %'").fetchall()}
    assert steps == {f"step {i}" for i in range(3, 9)}  # cudaProfilerApi range: steps 3..8 only
    per_rank = dict(con.execute("SELECT rank, count(*) FROM gpu_metrics GROUP BY rank").fetchall())
    assert per_rank.get(0, 0) > 0 and 1 not in per_rank  # one collector per node: rank 0
    assert con.execute("SELECT count(*) FROM nvtx WHERE text LIKE '%op_id = %'").fetchone()[0] > 0  # autograd-nvtx
    assert con.execute("SELECT count(*) FROM kernels WHERE short_name LIKE 'nccl%'").fetchone()[0] > 0


def test_pipeline_heavy_stage_found(runs) -> None:
    rep, files = runs["pp"]
    assert rep["imbalance"]["slowest_stage"] == 1
    c0, c1 = (Rank(f).metrics()["compute_ms"] for f in files)
    assert rep["imbalance"]["ratio"] == pytest.approx(c1 / c0, rel=1e-3)
    assert 1.7 < rep["imbalance"]["ratio"] < 2.6
    assert rep["findings"][0]["kind"] == "stage_imbalance"


def test_healthy_run_is_healthy(runs) -> None:
    rep, files = runs["ok"]
    assert [f["kind"] for f in rep["findings"] if f["severity"] in ("high", "medium")] == []
    assert any(f["kind"] == "healthy" for f in rep["findings"])
    for rank, f in enumerate(files):
        ind = Rank(f).metrics()
        got = rep["ranks"][rank]
        assert got["compute_ms"] == pytest.approx(ind["compute_ms"], abs=0.01)
        assert got["gpu_idle_pct"] == pytest.approx(ind["gpu_idle_pct"], abs=0.02)


def test_reports_written_on_the_device_agree(runs, tmp_path: Path) -> None:
    with tarfile.open(FIX / "reports.tar.gz") as tar:
        # The "data" filter where this Python has it (3.11.4+; Debian 12's 3.11.2 has not): the
        # archive is this repository's own.
        tar.extractall(tmp_path, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    for run in ("ddp", "pp", "ok"):
        device = json.loads((tmp_path / f"{run}.json").read_text())
        here, _ = runs[run]
        # The device ran an orch without the rules added since (host_sync, pipeline_bubble):
        # compare the kinds that orch could find.
        then = {"straggler", "data_loader_stall", "cpu_gap", "pageable_memcpy", "exposed_communication",
                "stage_imbalance", "launch_bound", "cpu_phase_outlier", "layout_needed", "healthy"}
        assert [f["kind"] for f in device["findings"]] == [f["kind"] for f in here["findings"] if f["kind"] in then]
        assert "<svg" in (tmp_path / f"{run}.html").read_text()
