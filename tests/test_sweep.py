"""`orch sweep` end to end with real torch and real nsys: two values of the planted data-loading
delay of the example workload, on the local executor and on the real local Slurm cluster;
the table must name the value with the lower step time, and every page must render."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.browser import dump_dom, screenshot
from tests.conftest import EXAMPLES, run_orch

pytestmark = [pytest.mark.jobs, pytest.mark.nsys, pytest.mark.browser]

SHOTS = Path("/tmp/orch-shots")


def _spec(tmp: Path, cluster: str, nproc: int, ranks: str) -> Path:
    spec = {
        "name": "sweep", "cluster": cluster, "run_root": str(tmp / "runs"),
        "launch": {"script": str(EXAMPLES / "train.py"), "nproc_per_node": nproc,
                   "args": ["--steps", "5", "--slow-rank", "1", "--slow-ms", "0"],
                   "env": {"GLOO_SOCKET_IFNAME": "lo"}},
        "profile": {"ranks": ranks, "trace": ["nvtx", "osrt"]},
    }
    p = tmp / "job.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def _check(tmp: Path, p: subprocess.CompletedProcess[str], name: str) -> None:
    assert p.returncode == 0, p.stdout + p.stderr
    s = json.loads((tmp / "sweep.json").read_text())
    assert [pt["values"] for pt in s["points"]] == [{"launch.args.5": "40"}, {"launch.args.5": "0"}]
    assert all(pt["state"] == "COMPLETED" and pt["step_ms"] for pt in s["points"])
    slow, fast = s["points"]
    assert fast["step_ms"] < slow["step_ms"] and s["best"] == 1  # no planted delay wins
    assert "best: launch.args.5=0 " in p.stdout and "launch.args.5 is the value of --slow-ms" in p.stdout
    assert re.search(r"launch\.args\.5=0 \*", p.stdout)  # the best row is marked in the table
    assert "data_load" in (slow["top_finding"] or "")
    dom = dump_dom(tmp / "sweep.html", tmp / "profile")
    rows = re.findall(r'<tr( class="best")? data-value="([^"]+)">', dom)
    assert rows == [("", "launch.args.5=40"), (' class="best"', "launch.args.5=0")]
    assert len(re.findall(r'class="sweep-bar"', dom)) == 2
    SHOTS.mkdir(exist_ok=True)
    screenshot(tmp / "sweep.html", SHOTS / f"{name}.png", tmp / "profile2", "1100,700")
    # Each job's own report is a CPU-only report: CPU phases, no GPU bars.
    for pt in s["points"]:
        page = dump_dom(Path(pt["report_html"]), tmp / "profile3")
        assert 'id="phase-bars"' in page and 'id="rank-bars"' not in page and 'class="seg"' not in page
        assert len(re.findall(r'<g class="lane"', page)) >= 2
    screenshot(Path(slow["report_html"]), SHOTS / f"{name}-cpu-report.png", tmp / "profile4")


def test_sweep_local_executor(tmp_path: Path, nsys: str) -> None:
    spec = _spec(tmp_path, "local", 2, "all")
    p = run_orch("sweep", str(spec), "--set", "launch.args.5=40,0", "--html", str(tmp_path / "sweep.html"),
                 "--json", str(tmp_path / "sweep.json"), "--timeout", "300", cwd=tmp_path, env={"COLUMNS": "100"})
    _check(tmp_path, p, "sweep-local")


@pytest.mark.slurm
def test_sweep_slurm(tmp_path: Path, nsys: str, slurm_cluster) -> None:
    """2 nodes x 1 process on the real local Slurm, both ranks profiled."""
    spec = _spec(tmp_path, "local-slurm", 1, "all")
    p = run_orch("sweep", str(spec), "--set", "launch.args.5=40,0", "--html", str(tmp_path / "sweep.html"),
                 "--json", str(tmp_path / "sweep.json"), "--timeout", "300", cwd=tmp_path,
                 env={**slurm_cluster.client_env, "COLUMNS": "100"})
    _check(tmp_path, p, "sweep-slurm")
