"""End to end with real components: the example torch workload under torchrun and real
nsys, submitted through submitit to the local executor and to a real 2-node Slurm
(with and without accounting), then collected and reported."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import duckdb
import pytest
import yaml

from tests.conftest import EXAMPLES, run_orch

pytestmark = [pytest.mark.jobs, pytest.mark.nsys]

SLEEPER = "import time\ntime.sleep(600)\n"


def _spec(tmp: Path, *, cluster: str, nproc: int, ranks: str, args: list[str] | None = None,
          script: str | None = None, slurm: dict | None = None, profile: dict | None = None) -> Path:
    spec = {
        "name": "e2e", "cluster": cluster, "run_root": str(tmp / "runs"),
        "launch": {"script": script or str(EXAMPLES / "train.py"), "nproc_per_node": nproc,
                   "args": args if args is not None else ["--steps", "4"], "env": {"GLOO_SOCKET_IFNAME": "lo"}},
        "layout": {"tp": 1, "pp": 1},
        "profile": {"ranks": ranks, "trace": ["nvtx", "osrt"], **(profile or {})},
    }
    if slurm:
        spec["slurm"] = slurm
    p = tmp / "job.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def _job_id(stdout: str) -> str:
    return re.search(r"as job (\S+)", stdout).group(1)


def _manifest(tmp: Path) -> dict:
    (m,) = list((tmp / "runs").glob("*/manifest.json"))
    return json.loads(m.read_text())


def _check_reports(tmp: Path, job_id: str, expect: dict[int, str]) -> None:
    m = _manifest(tmp)
    assert m["job_id"] == job_id and m["profiled_ranks"] == sorted(expect)
    assert [e["rank"] for e in m["expected_reports"]] == sorted(expect)
    names = sorted(p.name for p in Path(m["report_dir"]).iterdir())
    assert len(names) == len(expect), names
    for name, (rank, host) in zip(names, sorted(expect.items()), strict=True):
        assert re.fullmatch(rf"e2e_{job_id}_r{rank}_{host}\.\d+\.nsys-rep", name), name


def test_local_executor_end_to_end(tmp_path: Path, nsys: str) -> None:
    """One node x 4 processes (gloo), ranks 0 and 3 profiled, rank 3 planted slow."""
    import socket

    spec = _spec(tmp_path, cluster="local", nproc=4, ranks="0,3",
                 args=["--steps", "5", "--slow-rank", "3", "--slow-ms", "30"])
    p = run_orch("submit", str(spec), "--wait", cwd=tmp_path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "COMPLETED" in p.stdout
    job = _job_id(p.stdout)
    host = socket.gethostname()
    _check_reports(tmp_path, job, {0: host, 3: host})
    runs = str(tmp_path / "runs")
    st = run_orch("status", job, "--runs", runs)
    assert st.returncode == 0 and "COMPLETED" in st.stdout and "rank 3: e2e_" in st.stdout
    c = run_orch("collect", job, "--runs", runs)
    assert c.returncode == 0, c.stderr
    store = next((tmp_path / "runs").glob("*/profile.duckdb"))
    con = duckdb.connect(str(store), read_only=True)
    assert con.execute("SELECT list(rank ORDER BY rank), list(host) FROM ranks").fetchone() == ([0, 3], [host, host])
    assert con.execute("SELECT count(DISTINCT text) FROM nvtx WHERE text LIKE 'step %'").fetchone()[0] == 5
    con.close()
    r = run_orch("report", job, "--runs", runs, "--json", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    top = rep["findings"][0]
    assert top["kind"] == "cpu_phase_outlier" and top["ranks"] == [3] and "data_load" in top["title"]


@pytest.mark.slurm
def test_slurm_two_nodes_end_to_end(tmp_path: Path, nsys: str, slurm_cluster) -> None:
    """2 nodes x 2 processes on the real local Slurm, ranks 0 and 3: rank 0's report comes
    from node1 and rank 3's from node2, named with %h.%p."""
    spec = _spec(tmp_path, cluster="local-slurm", nproc=2, ranks="0,3")
    p = run_orch("submit", str(spec), "--wait", "--timeout", "300", cwd=tmp_path, env=slurm_cluster.client_env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "COMPLETED (from sacct)" in p.stdout
    job = _job_id(p.stdout)
    _check_reports(tmp_path, job, {0: "node1", 3: "node2"})
    # Each rank exported and mapped its report in its Slurm step (profile.map_in_job, on by
    # default): collect maps nothing and reduces the job's parts.
    (run,) = (tmp_path / "runs").iterdir()
    metas = [json.loads(f.read_text()) for f in sorted((run / "parts" / "reports").glob("*.json"))]
    assert sorted(m["map_rank"] for m in metas if m["in_job"] and not m["error"]) == [0, 3], metas
    c = run_orch("collect", job, "--runs", str(tmp_path / "runs"))
    assert c.returncode == 0, c.stderr
    assert "(0 report(s) mapped, 2 reused)" in " ".join(c.stdout.split()), c.stdout
    con = duckdb.connect(str(next((tmp_path / "runs").glob("*/profile.duckdb"))), read_only=True)
    assert con.execute("SELECT list(host ORDER BY rank), list(node ORDER BY rank) FROM ranks").fetchone() == \
        (["node1", "node2"], [0, 1])


def _wait_state(job: str, runs: Path, env: dict, want: set[str], timeout: float = 240) -> str:
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        st = run_orch("status", job, "--runs", str(runs), "--json", env=env)
        assert st.returncode == 0, st.stderr
        state = json.loads(st.stdout)["state"]
        if state in want:
            return state
        time.sleep(2)
    return state


@pytest.mark.slurm
def test_slurm_failure_paths(tmp_path: Path, slurm_cluster) -> None:
    env = slurm_cluster.client_env
    # Unknown partition: Slurm's reason in one line, no run directory left behind.
    bad = _spec(tmp_path, cluster="local-slurm", nproc=1, ranks="none", slurm={"partition": "nosuch"})
    p = run_orch("submit", str(bad), cwd=tmp_path, env=env)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "sbatch rejected the job" in p.stderr and "partition" in p.stderr.lower()
    assert not list((tmp_path / "runs").glob("*"))

    # A task that exits non-zero: FAILED with the log tail.
    fail = _spec(tmp_path, cluster="local-slurm", nproc=2, ranks="none", args=["--fail-rank", "2"])
    p = run_orch("submit", str(fail), "--wait", "--timeout", "300", cwd=tmp_path, env=env)
    assert p.returncode == 1 and "FAILED" in p.stdout, p.stdout + p.stderr
    job = _job_id(p.stdout)
    st = run_orch("status", job, "--runs", str(tmp_path / "runs"), env=env)
    assert "FAILED" in st.stdout and "log tail" in st.stdout
    # Each task's row says what happened on its node: rank 2 (node2) failed, node1 was stopped.
    tasks = json.loads(run_orch("status", job, "--runs", str(tmp_path / "runs"), "--json", env=env).stdout)["tasks"]
    assert tasks[1]["error"] == "rank 2 failed first (exit status 3)", tasks
    assert tasks[0]["error"].startswith("stopped by SIGTERM"), tasks

    # Cancel a running job.
    (tmp_path / "sleep.py").write_text(SLEEPER)
    long = _spec(tmp_path, cluster="local-slurm", nproc=1, ranks="none", args=[], script=str(tmp_path / "sleep.py"))
    p = run_orch("submit", str(long), cwd=tmp_path, env=env)
    job = _job_id(p.stdout)
    assert _wait_state(job, tmp_path / "runs", env, {"RUNNING"}) == "RUNNING"
    assert run_orch("cancel", job, "--runs", str(tmp_path / "runs"), env=env).returncode == 0
    assert _wait_state(job, tmp_path / "runs", env, {"CANCELLED"}) == "CANCELLED"

    # Over its time limit (1 minute): TIMEOUT.
    short = _spec(tmp_path, cluster="local-slurm", nproc=1, ranks="none", args=[],
                  script=str(tmp_path / "sleep.py"), slurm={"time": "1"})
    p = run_orch("submit", str(short), cwd=tmp_path, env=env)
    job = _job_id(p.stdout)
    assert _wait_state(job, tmp_path / "runs", env, {"TIMEOUT", "FAILED", "CANCELLED"}, timeout=300) == "TIMEOUT"


@pytest.mark.slurm
def test_slurm_without_accounting_state_never_sticks(tmp_path: Path, slurm_cluster_noacct) -> None:
    """sacct fails without slurmdbd: state comes from squeue/scontrol and still reaches
    COMPLETED, FAILED and CANCELLED."""
    env = slurm_cluster_noacct.client_env
    ok = _spec(tmp_path, cluster="local-slurm", nproc=1, ranks="none", args=["--steps", "2"])
    p = run_orch("submit", str(ok), "--wait", "--timeout", "300", cwd=tmp_path, env=env)
    assert p.returncode == 0 and "COMPLETED" in p.stdout and "sacct" not in p.stdout, p.stdout + p.stderr
    fail = _spec(tmp_path, cluster="local-slurm", nproc=2, ranks="none", args=["--fail-rank", "1"])
    p = run_orch("submit", str(fail), "--wait", "--timeout", "300", cwd=tmp_path, env=env)
    assert p.returncode == 1 and "FAILED" in p.stdout
    (tmp_path / "sleep.py").write_text(SLEEPER)
    long = _spec(tmp_path, cluster="local-slurm", nproc=1, ranks="none", args=[], script=str(tmp_path / "sleep.py"))
    job = _job_id(run_orch("submit", str(long), cwd=tmp_path, env=env).stdout)
    assert _wait_state(job, tmp_path / "runs", env, {"RUNNING"}) == "RUNNING"
    assert run_orch("cancel", job, "--runs", str(tmp_path / "runs"), env=env).returncode == 0
    assert _wait_state(job, tmp_path / "runs", env, {"CANCELLED"}) == "CANCELLED"


@pytest.mark.slurm
def test_slurm_node_killed_during_job(tmp_path: Path, slurm_cluster_disposable) -> None:
    """node2 dies (its slurmd and every process in its namespace are killed) while a 2-node
    job runs: status says the job failed and which task was lost; collect says what is missing."""
    import os
    import signal

    c = slurm_cluster_disposable
    env = c.client_env
    (tmp_path / "sleep.py").write_text(SLEEPER)
    spec = _spec(tmp_path, cluster="local-slurm", nproc=1, ranks="0", args=[], script=str(tmp_path / "sleep.py"))
    job = _job_id(run_orch("submit", str(spec), cwd=tmp_path, env=env).stdout)
    runs = tmp_path / "runs"
    assert _wait_state(job, runs, env, {"RUNNING"}) == "RUNNING"
    time.sleep(3)
    ns = (c.dir / "pids" / "ns-node2").read_text().strip()
    killed = 0
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if os.readlink(p / "ns" / "uts") == ns:
                    os.kill(int(p.name), signal.SIGKILL)
                    killed += 1
            except OSError:
                continue
    assert killed >= 2  # slurmd and the job's processes on node2
    state = _wait_state(job, runs, env, {"NODE_FAIL", "FAILED", "CANCELLED"}, timeout=240)
    assert state in ("NODE_FAIL", "FAILED"), state
    st = json.loads(run_orch("status", job, "--runs", str(runs), "--json", env=env).stdout)
    results = {t["task"]: t["result"] for t in st["tasks"]}
    assert results[1] in ("lost", "error"), st["tasks"]
    # Rank 0 (node1) ran under nsys: whether nsys got to write its report as the job was torn
    # down varies; collect gathers what exists, or says in one line that nothing does.
    col = run_orch("collect", job, "--runs", str(runs), env=env)
    if col.returncode == 0:
        assert "store:" in col.stdout
    else:
        assert col.returncode == 2 and "no reports" in col.stderr and len(col.stderr.strip().splitlines()) == 1
