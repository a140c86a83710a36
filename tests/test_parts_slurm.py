"""`orch collect --on-cluster` on the real two-node local Slurm: a job profiled with real nsys,
its reports mapped by a Slurm job array (tasks on node1 and node2, seen in sacct), and the
store and report identical to the in-process collect's; a corrupt report fails its task,
names it, leaves every other rank collected, and a re-run after the file is replaced maps
only that report."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import duckdb
import pytest

from orchestrator.metrics.engine import Options
from tests.conftest import run_orch
from tests.test_e2e import _job_id, _manifest, _spec
from tests.test_parts import assert_same_report, assert_same_store, mapped_ranks

pytestmark = [pytest.mark.jobs, pytest.mark.nsys, pytest.mark.slurm]

ARRAY = ["--on-cluster", "--task-cpus", "4", "--chunk", "1", "--timeout", "400"]  # 4 CPUs: one task per node


def _array_nodes(stdout: str, env: dict[str, str], tasks: int = 4) -> tuple[str, set[str], dict[str, str]]:
    """The array's tasks as accounting records them; slurmdbd can lag a few seconds behind the
    job's end, so ask again until every task has a row of its own in a final state."""
    array = re.search(r"array task\(s\), job (\d+)", stdout)
    assert array, stdout
    deadline = time.monotonic() + 60
    while True:
        p = subprocess.run(["sacct", "-j", array.group(1), "-X", "-n", "-P", "-o", "JobID,State,NodeList"],
                           capture_output=True, text=True, env=env, check=True, timeout=60)
        rows = [r.split("|") for r in p.stdout.split()]
        done = [r for r in rows if re.fullmatch(r"\d+_\d+", r[0]) and r[1] in ("COMPLETED", "FAILED")]
        if len(done) >= tasks or time.monotonic() > deadline:
            return array.group(1), {node for _, _, node in rows}, {jid: state for jid, state, _ in rows}
        time.sleep(2)


@pytest.mark.slurm
def test_collect_on_cluster_matches_local(tmp_path: Path, nsys: str, slurm_cluster) -> None:
    env = slurm_cluster.client_env
    # The array maps what the job did not: here, every rank (the job's own maps are tested in
    # tests/test_e2e.py and tests/test_map_in_job.py).
    spec = _spec(tmp_path, cluster="local-slurm", nproc=2, ranks="all", profile={"map_in_job": False})
    p = run_orch("submit", str(spec), "--wait", "--timeout", "300", cwd=tmp_path, env=env)
    assert p.returncode == 0 and "COMPLETED" in p.stdout, p.stdout + p.stderr
    job = _job_id(p.stdout)
    runs = str(tmp_path / "runs")
    run = Path(_manifest(tmp_path)["report_dir"]).parent

    c = run_orch("collect", job, "--runs", runs, *ARRAY, env=env)
    assert c.returncode == 0, c.stdout + c.stderr
    assert "store: " in c.stdout and "4 rank(s) ok, engine parts" in c.stdout, c.stdout
    assert "4 report(s) mapped, 0 reused" in c.stdout
    _, nodes, states = _array_nodes(c.stderr, env)
    assert nodes == {"node1", "node2"} and set(states.values()) == {"COMPLETED"}, states
    metas = [json.loads(f.read_text()) for f in (run / "parts" / "reports").glob("*.json")]
    assert {m["host"] for m in metas} == {"node1", "node2"}
    assert all(m["seconds"]["export"] > 0 and m["export_bytes"] for m in metas)  # nsys export ran on the node
    # Each task computed its ranks' per-rank statistics (--map-stats, on by default here) and
    # the report takes every rank's from them.
    assert all(m["summaries"] and m["summary_error"] is None for m in metas)
    assert mapped_ranks(run / "profile.duckdb", Options()) == [0, 1, 2, 3]
    shutil.copy(run / "profile.duckdb", tmp_path / "cluster.duckdb")

    # The in-process collect of the same run (it reuses the exports the array made).
    c = run_orch("collect", job, "--runs", runs, env=env)
    assert c.returncode == 0 and "engine scanner" in c.stdout, c.stdout + c.stderr
    assert_same_store(run / "profile.duckdb", tmp_path / "cluster.duckdb")
    assert_same_report(run / "profile.duckdb", tmp_path / "cluster.duckdb")
    con = duckdb.connect(str(tmp_path / "cluster.duckdb"), read_only=True)
    assert con.execute("SELECT list(host ORDER BY rank) FROM ranks").fetchone()[0] == \
        ["node1", "node1", "node2", "node2"]
    con.close()

    # --from with a corrupt report: its task FAILS and is named with its log; the rest is collected.
    src = tmp_path / "src"
    shutil.copytree(run / "reports", src)
    (bad,) = src.glob("*_r2_*.nsys-rep")
    shutil.copy(bad, tmp_path / "good.nsys-rep")
    bad.write_bytes(bad.read_bytes()[:20_000])
    out = tmp_path / "from"
    c = run_orch("collect", "--from", str(src), "--out", str(out), "--cluster", "local-slurm", *ARRAY, env=env)
    assert c.returncode == 0, c.stdout + c.stderr
    assert "3 rank(s) ok" in c.stdout and "4 report(s) mapped" in c.stdout, c.stdout
    failed = re.search(r"map task (\d+_\d+) FAILED on node\d: (\S+)", c.stdout)
    assert failed and failed.group(2) == bad.name, c.stdout
    assert "log tail" in c.stdout and "nsys export failed" in c.stdout
    _, _, states = _array_nodes(c.stderr, env)
    assert states[failed.group(1)] == "FAILED" and sum(s == "COMPLETED" for s in states.values()) == 3, states
    con = duckdb.connect(str(out / "profile.duckdb"), read_only=True)
    # CPU-only captures are `partial` (no CUDA tables): the corrupt one alone is an error.
    assert con.execute("SELECT list(status = 'error' ORDER BY rank) FROM ranks").fetchone()[0] == \
        [False, False, True, False]
    con.close()

    shutil.copy(tmp_path / "good.nsys-rep", bad)  # replaced: the re-run maps only this one
    c = run_orch("collect", "--from", str(src), "--out", str(out), "--cluster", "local-slurm", *ARRAY, env=env)
    assert c.returncode == 0, c.stdout + c.stderr
    assert "4 rank(s) ok" in c.stdout and "1 report(s) mapped, 3 reused" in c.stdout, c.stdout
    assert "1 array task(s)" in c.stderr and "FAILED" not in c.stdout
