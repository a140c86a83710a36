"""`collect_run`, the collect of a submitted job's run directory (`orch collect JOB`, `orch
sweep`): the options come from the manifest, and the job's end (scheduler state, dump files)
is kept in the store's meta, so a store copied away from its run directory still has it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import duckdb
import pytest
from rich.console import Console

from orchestrator.collect.options import CollectOptions
from orchestrator.collect.run import collect_run
from orchestrator.layout import Layout
from orchestrator.rundir import Manifest
from tests.conftest import REPO

pytestmark = pytest.mark.replay

FIXTURES = REPO / "tests" / "fixtures" / "real"


def _run_dir(tmp: Path) -> Path:
    """A local job's run directory: its manifest, two ranks' reports (real exports renamed as
    the job names them, beside one that is not its own) and a stack dump."""
    run = tmp / "runs" / "job"
    reports = run / "reports"
    reports.mkdir(parents=True)
    for rank, f in enumerate(sorted(FIXTURES.glob("healthy_r*.sqlite.gz"))[:2]):
        shutil.copy(f, reports / f"train_4242_r{rank}_vm.{100 + rank}.sqlite.gz")
    shutil.copy(next(FIXTURES.glob("ddp_slowrank_r0_*.sqlite.gz")), reports / "other_1_r0_vm.1.sqlite.gz")
    (run / "dumps").mkdir()
    (run / "dumps" / "stacks.r1.txt").write_text("Thread 0x1 (most recent call first):\n")
    (run / "dumps" / "empty.txt").write_text("")
    Manifest(orch_version="0", name="train", job_id="4242", executor="local", cluster="local",
             submitted_at="2026-01-01T00:00:00+00:00", nodes=1, nproc_per_node=2, world_size=2,
             layout=Layout(), profiled_ranks=[0, 1], output_name="train", report_dir=str(reports),
             report_pattern="train_4242_r%q{RANK}", expected_reports=[],
             submitit_folder=str(run / "submitit")).write(run)
    return run


def test_collect_run_keeps_the_jobs_end_in_a_copied_store(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    res = collect_run(run, CollectOptions(console=Console(stderr=True, quiet=True), workers=2))
    assert res.ok_ranks == [0, 1] and res.missing == [] and res.extra == []
    assert [m.report.origin.name for m in res.members] == ["train_4242_r0_vm.100.sqlite.gz",
                                                            "train_4242_r1_vm.101.sqlite.gz"]
    copied = tmp_path / "elsewhere" / "profile.duckdb"
    copied.parent.mkdir()
    shutil.copy(res.store, copied)
    shutil.rmtree(run)  # nothing of the run directory is left to read
    con = duckdb.connect(str(copied), read_only=True)
    meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    con.close()
    assert meta["job_id"] == "4242"
    job = json.loads(meta["job"])
    assert job["dumps"] == ["dumps/stacks.r1.txt"]  # relative to the run directory; empty files left out
    assert job["job_id"] == "4242" and job["executor"] == "local"


def test_collect_run_parts_route_writes_the_same_meta(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    quiet = Console(stderr=True, quiet=True)
    res = collect_run(run, CollectOptions(console=quiet, workers=2, parts=True))
    assert res.engine == "parts" and res.ok_ranks == [0, 1] and res.mapped == 2
    con = duckdb.connect(str(res.store), read_only=True)
    meta = dict(con.execute("SELECT key, value FROM meta").fetchall())
    con.close()
    assert json.loads(meta["job"])["dumps"] == ["dumps/stacks.r1.txt"]


def test_the_manifest_keeps_the_jobs_pipeline_schedule(tmp_path: Path) -> None:
    """The layout a job was submitted with (pp, vpp, microbatches, cp, ep) reads back from its
    manifest whole, so the bubble's theory needs no flag; a manifest whose layout has only tp,
    pp and dp takes the rest from the spec it carries."""
    from orchestrator.rundir import read_manifest

    def manifest(layout: Layout, spec: dict) -> Manifest:
        return Manifest(orch_version="0", name="pp", job_id="1", executor="local", cluster="local",
                        submitted_at="2026-01-01T00:00:00+00:00", nodes=1, nproc_per_node=8, world_size=8,
                        spec=spec, layout=layout, profiled_ranks=list(range(8)), output_name="pp",
                        report_dir=str(tmp_path), report_pattern="pp_1_r%q{RANK}", expected_reports=[],
                        submitit_folder=str(tmp_path / "submitit"))

    manifest(Layout(pp=2, vpp=2, dp=2, cp=2, microbatches=4, known=True), {}).write(tmp_path)
    lay = read_manifest(tmp_path).job_layout()
    assert (lay.pp, lay.vpp, lay.dp, lay.cp, lay.microbatches, lay.world_size) == (2, 2, 2, 2, 4, 8)
    data = json.loads((tmp_path / "manifest.json").read_text())
    data["layout"] = {"tp": 1, "pp": 2, "dp": 4, "known": True}
    data["spec"] = {"layout": {"pp": 2, "microbatches": 8}}
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    lay = read_manifest(tmp_path).job_layout()
    assert (lay.pp, lay.dp, lay.microbatches, lay.vpp) == (2, 4, 8, 1)
