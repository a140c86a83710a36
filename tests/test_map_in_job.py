"""Each profiled rank maps its own export inside the job (profile.map_in_job, on with the
export unless the spec turns it off): a real job through
`orch submit` on the local executor with real nsys. The job leaves every rank's Parquet parts
and per-rank statistics; `orch collect` then only reduces them, and its store and report are
the ones the in-process collect makes of the same exports."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.analyze.build import build_report
from orchestrator.metrics.engine import Options
from orchestrator.render import render
from orchestrator.spec import load_job
from orchestrator.spec.model import JobSpec
from tests import independent
from tests.conftest import capture_cpu, processes, run_orch
from tests.test_export_in_job import _spec
from tests.test_parts import assert_same_report, assert_same_store, mapped_ranks

pytestmark = pytest.mark.jobs


def _metas(run: Path) -> list[dict]:
    return [json.loads(f.read_text()) for f in sorted((run / "parts" / "reports").glob("*.json"))]


@pytest.mark.nsys
def test_the_job_maps_its_ranks_and_collect_only_reduces(tmp_path: Path, nsys: str) -> None:
    p = run_orch("submit", str(_spec(tmp_path)), "--wait", "--timeout", "240")
    assert p.returncode == 0 and "COMPLETED" in p.stdout, p.stdout + p.stderr + processes()
    (run,) = (tmp_path / "runs").iterdir()
    logs = "".join(f.read_text() for f in (run / "submitit").glob("*_log.err"))
    assert logs.count("orch: mapped injob_") == 2 and "could not map" not in logs, logs
    metas = _metas(run)
    assert len(metas) == 2 and all(m["in_job"] and m["summaries"] and not m["summary_error"] for m in metas), metas
    assert sorted(m["map_rank"] for m in metas) == [0, 1]
    written = {m["id"]: m["written_ns"] for m in metas}

    c = run_orch("collect", str(run))
    assert c.returncode == 0, c.stderr
    assert "(0 report(s) mapped, 2 reused)" in " ".join(c.stdout.split()), c.stdout
    assert {m["id"]: m["written_ns"] for m in _metas(run)} == written  # the job's parts, as they are
    assert mapped_ranks(run / "profile.duckdb", Options()) == [0, 1]  # statistics from the job's maps

    # The in-process collect of the same exports: with the parts set aside, collect reads the
    # job's exports itself; the two stores (but the map's tables) and reports must be the same
    # (the job's store reads its events from the parts: they go back before the comparison).
    in_job = tmp_path / "in_job.duckdb"
    shutil.copy(run / "profile.duckdb", in_job)
    (run / "parts").rename(tmp_path / "job-parts")
    (run / "profile.duckdb").unlink()
    c2 = run_orch("collect", str(run))
    assert c2.returncode == 0 and "engine parts" not in c2.stdout, c2.stdout + c2.stderr
    (tmp_path / "job-parts").rename(run / "parts")
    assert_same_store(in_job, run / "profile.duckdb")
    assert_same_report(in_job, run / "profile.duckdb")


@pytest.mark.nsys
def test_the_maps_of_failed_ranks_cut_the_step_they_were_stopped_in(tmp_path: Path, nsys: str) -> None:
    """Rank 1 is SIGKILLed in step 3 (as the OOM killer does) and its peer's program fails on
    the lost connection: both exit non-zero, and their wrappers say so to the job's maps, which
    cut the step their rank was stopped in, as the job's report does (jobmap.py). The report
    takes from the maps the statistics of the ranks stopped in the step it cuts (by plain
    sqlite3 over the exports: the lowest of the ranks' last `step N` ranges), and equals the
    in-process one.

    Which ranks the job maps is a race: the first wrapper to exit has mapped its rank, and
    torchrun then stops the other, whose export or map a stop ends (export_report.sh); collect
    maps that rank itself. What orch guarantees is the report: every rank's statistics, cut at
    the step it was stopped in, from the job's map or from its events; and every map the job
    did make is cut right (the report takes it for a rank stopped in the step it cuts)."""
    spec = _spec(tmp_path)
    data = yaml.safe_load(spec.read_text())
    data["launch"]["args"] = ["--steps", "8", "--fault", "sigkill", "--fault-rank", "1", "--fault-step", "3"]
    spec.write_text(yaml.safe_dump(data))
    p = run_orch("submit", str(spec), "--wait", "--timeout", "240")
    assert p.returncode != 0 and "FAILED" in p.stdout + p.stderr, p.stdout + p.stderr + processes()
    (run,) = (tmp_path / "runs").iterdir()
    in_job = sorted(m["map_rank"] for m in _metas(run) if m["in_job"] and m["summaries"])
    assert in_job and set(in_job) <= {0, 1} and len(_metas(run)) == len(in_job), _metas(run)
    # Each map the job finished says it cut the step (a map stopped after its meta says nothing;
    # the job's error repeats the lines torchrun printed, so each is counted once).
    logs = "".join(f.read_text() for f in (run / "submitit").glob("*_log.err"))
    said = {ln for ln in logs.splitlines() if "orch: mapped injob_" in ln}
    assert said and len(said) <= len(in_job), logs
    assert all("statistics without the step it was stopped in (it exited" in ln for ln in said), said

    c = run_orch("collect", str(run))
    out = " ".join(c.stdout.split())
    assert c.returncode == 0 and f"({2 - len(in_job)} report(s) mapped, {len(in_job)} reused)" in out, c.stdout
    last = independent.last_steps(run, "step ")  # scripts/examples/train.py's `step N` ranges
    behind = [rank for rank, step in sorted(last.items()) if step == min(last.values())]
    assert sorted(last) == [0, 1] and behind, last
    assert mapped_ranks(run / "profile.duckdb", Options(), "map_done") == in_job  # collect's maps compute none
    assert mapped_ranks(run / "profile.duckdb", Options()) == [r for r in behind if r in in_job], (last, in_job)
    report = build_report(run / "profile.duckdb", Options())
    assert [r.rank for r in report.ranks] == [0, 1] and not report.missing_ranks

    job_store = tmp_path / "in_job.duckdb"  # the in-process collect of the same exports, as above
    shutil.copy(run / "profile.duckdb", job_store)
    (run / "parts").rename(tmp_path / "job-parts")
    (run / "profile.duckdb").unlink()
    assert run_orch("collect", str(run)).returncode == 0
    (tmp_path / "job-parts").rename(run / "parts")
    assert_same_report(job_store, run / "profile.duckdb")


@pytest.mark.nsys
def test_a_rank_the_job_did_not_map_is_mapped_by_collect(tmp_path: Path, nsys: str) -> None:
    """One rank's in-job map is lost (its parts removed, as if its node's map was killed):
    collect maps that rank itself and reduces both."""
    p = run_orch("submit", str(_spec(tmp_path)), "--wait", "--timeout", "240")
    assert p.returncode == 0, p.stdout + p.stderr + processes()
    (run,) = (tmp_path / "runs").iterdir()
    lost = sorted((run / "parts" / "reports").glob("*.json"))[0]
    lost.unlink()
    c = run_orch("collect", str(run))
    assert c.returncode == 0, c.stderr
    assert "(1 report(s) mapped, 1 reused)" in " ".join(c.stdout.split()), c.stdout
    metas = _metas(run)
    assert sorted(m["in_job"] for m in metas) == [False, True] and all(not m["error"] for m in metas)
    # The rank collect mapped has no statistics (the local pool computes none): the analysis
    # computes it; the job's rank is taken from its map.
    assert mapped_ranks(run / "profile.duckdb", Options()) == [m["map_rank"] for m in metas if m["in_job"]]


def test_map_in_job_renders_orchs_python_and_needs_the_export(tmp_path: Path) -> None:
    on = render(load_job(_spec(tmp_path)), tmp_path / "on" / "scripts")  # on by default
    off = render(load_job(_spec(tmp_path, map_in_job=False)), tmp_path / "off" / "scripts")
    assert "orchestrator.collect.jobmap" in on.scripts["export_report.sh"]
    assert str(tmp_path / "on") in on.scripts["export_report.sh"]  # the run directory it maps into
    assert sys.executable in on.scripts["export_report.sh"]  # the interpreter orch runs on
    assert "jobmap" not in off.scripts["export_report.sh"]
    # Without the export there is nothing to map: unset, the map is off with it; asked for, an error.
    assert not load_job(_spec(tmp_path, export_in_job=False)).spec.profile.maps_in_job
    with pytest.raises(ValueError, match="map_in_job maps the export the job makes: set export_in_job: true"):
        JobSpec.model_validate({"name": "x", "launch": {"script": "t.py"},
                                "profile": {"map_in_job": True, "export_in_job": False}})


@pytest.mark.nsys
def test_a_node_without_orchs_python_exports_and_leaves_the_map_to_collect(
        tmp_path: Path, nsys: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The interpreter rendered into the job is not on the node (a container, a disk only the
    login node has): the rank's export is made, the map is skipped with one line, the script
    succeeds and leaves no parts."""
    run = tmp_path / "run"
    report = run / "reports" / "injob_1_r0_vm.7.nsys-rep"
    report.parent.mkdir(parents=True)
    capture_cpu(nsys, "import nvtx\nwith nvtx.annotate('step 0'):\n    pass\n", report.with_suffix(""),
                trace="nvtx")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "login-node-only" / "python"))
    script = run / "scripts" / "export_report.sh"
    script.parent.mkdir()
    script.write_text(render(load_job(_spec(tmp_path)), run / "scripts").scripts["export_report.sh"])
    p = subprocess.run(["bash", str(script), str(report)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "orch: exported injob_1_r0_vm.7" in p.stderr
    assert f"orch: {tmp_path}/login-node-only/python is not on " in p.stderr
    assert "orch collect will map injob_1_r0_vm.7" in p.stderr
    assert (run / "exports" / "injob_1_r0_vm.7.sqlite").is_file() and not (run / "parts").exists()
