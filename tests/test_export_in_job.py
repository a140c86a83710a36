"""Each profiled rank exports its own report inside the job (profile.export_in_job), and
`orch collect` takes those exports as they are: a real job through `orch submit` on the local
executor with real nsys; its store and report must be the ones collect makes when it exports
the same reports itself."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from orchestrator.render import render
from orchestrator.spec import load_job
from tests.conftest import EXAMPLES, processes, run_orch
from tests.test_parts import assert_same_report, assert_same_store

pytestmark = [pytest.mark.jobs, pytest.mark.nsys]


def _spec(tmp: Path, **profile: object) -> Path:
    spec = {"name": "injob", "cluster": "local", "run_root": str(tmp / "runs"),
            "launch": {"script": str(EXAMPLES / "train.py"), "nproc_per_node": 2, "args": ["--steps", "6"],
                       "env": {"GLOO_SOCKET_IFNAME": "lo"}},
            "profile": {"ranks": "all", "trace": ["nvtx", "osrt"], **profile}}
    p = tmp / "job.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


@pytest.mark.nsys
def test_exports_made_in_the_job_are_what_collect_would_make(tmp_path: Path, nsys: str) -> None:
    # The exports alone: the job's maps (tests/test_map_in_job.py) would let collect skip them.
    p = run_orch("submit", str(_spec(tmp_path, map_in_job=False)), "--wait", "--timeout", "240")
    assert p.returncode == 0 and "COMPLETED" in p.stdout, p.stdout + p.stderr + processes()
    (run,) = (tmp_path / "runs").iterdir()
    reports = sorted((run / "reports").glob("*.nsys-rep"))
    exports = {r: run / "exports" / (r.name.removesuffix(".nsys-rep") + ".sqlite") for r in reports}
    assert len(reports) == 2 and all(e.is_file() for e in exports.values()), sorted((run / "exports").iterdir())
    assert not list((run / "exports").glob(".*"))  # no temp left
    logs = "".join(f.read_text() for f in (run / "submitit").glob("*_log.err"))
    assert logs.count("orch: exported injob_") == 2, logs
    before = {e: (e.stat().st_ino, e.stat().st_mtime_ns) for e in exports.values()}

    c = run_orch("collect", str(run))
    assert c.returncode == 0, c.stderr
    assert {e: (e.stat().st_ino, e.stat().st_mtime_ns) for e in exports.values()} == before  # taken as they are

    # Today's path on the same run: with the job's exports set aside, collect exports every
    # report itself; the two stores and reports must be the same.
    in_job = tmp_path / "in_job.duckdb"
    shutil.copy(run / "profile.duckdb", in_job)
    (run / "exports").rename(tmp_path / "job-exports")
    (run / "profile.duckdb").unlink()
    c2 = run_orch("collect", str(run))
    assert c2.returncode == 0, c2.stderr
    assert {e: e.stat().st_ino for e in exports.values()} != {e: i for e, (i, _) in before.items()}  # made anew
    assert_same_store(in_job, run / "profile.duckdb")
    assert_same_report(in_job, run / "profile.duckdb")


def test_export_in_job_off_renders_no_export(tmp_path: Path) -> None:
    on = render(load_job(_spec(tmp_path)), tmp_path / "on" / "scripts")
    off = render(load_job(_spec(tmp_path, export_in_job=False)), tmp_path / "off" / "scripts")
    assert 'bash "$here/export_report.sh"' in on.scripts["rank_wrapper.sh"]
    assert "export_report.sh" not in off.scripts["rank_wrapper.sh"]
    assert str(tmp_path / "on" / "exports") in on.scripts["export_report.sh"]  # the run's exports/
