"""Real jobs that do not end by themselves, through `orch submit` on the local executor (gloo on
CPU, real nsys): a rank that hangs until the time limit, `orch cancel` mid-run, a rank that
raises, a rank SIGKILLed. Each asserts the state, the reports kept, their NVTX ranges (read with
sqlite3 from nsys' own export) and that no process of the job survives (tests/subreaper.py:
every process the job started stays a descendant of the test's subreaper, checked by pid)."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import EXAMPLES, REPO, JobTree

pytestmark = [pytest.mark.jobs, pytest.mark.nsys]


def _spec(tmp: Path, args: list[str], time_limit: str, grace: int = 25, lead: int = 33, cluster: str = "local",
          nproc: int = 2) -> Path:
    spec = {
        "name": "stops", "cluster": cluster, "run_root": str(tmp / "runs"), "slurm": {"time": time_limit},
        "launch": {"script": str(EXAMPLES / "train.py"), "nproc_per_node": nproc, "args": args,
                   "env": {"GLOO_SOCKET_IFNAME": "lo"}},
        "layout": {"tp": 1, "pp": 1},
        "profile": {"ranks": "all", "trace": ["nvtx", "osrt"], "stop_grace_s": grace, "warn_lead_s": lead},
    }
    p = tmp / "job.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


def _run_dir(tmp: Path) -> Path:
    (run,) = list((tmp / "runs").iterdir())
    return run


def _nvtx(report: Path) -> list[tuple[str, int | None]]:
    """(text, end) of every NVTX range of a report, from nsys' own SQLite export; not orch's Python
    samples (domain `orch.py`: instant ranges in the main thread wherever it runs Python)."""
    out = report.with_suffix(".sqlite")
    subprocess.run(["nsys", "export", "--type", "sqlite", "--force-overwrite=true", "-o", str(out), str(report)],
                   check=True, capture_output=True, timeout=300)
    con = sqlite3.connect(out)
    rows = con.execute("SELECT coalesce(e.text, s.value) AS t, e.\"end\" FROM NVTX_EVENTS e "
                       "LEFT JOIN StringIds s ON s.id = e.textId WHERE t IS NOT NULL AND e.eventType <> 75 AND "
                       "e.domainId NOT IN (SELECT domainId FROM NVTX_EVENTS WHERE eventType = 75 AND text = 'orch.py') "
                       "ORDER BY e.start").fetchall()
    con.close()
    return rows


def _reports(run: Path) -> dict[int, Path]:
    return {int(re.search(r"_r(\d+)_", p.name).group(1)): p for p in (run / "reports").glob("*.nsys-rep")}


def _report(tree: JobTree, tmp: Path) -> dict:
    """`orch collect` then `orch report --json` of the test's one run."""
    run = _run_dir(tmp)
    c = tree.orch("collect", str(run))
    assert c.returncode == 0, c.stderr
    r = tree.orch("report", str(run), "--json", str(tmp / "r.json"))
    assert r.returncode == 0, r.stderr
    return json.loads((tmp / "r.json").read_text())


def _steps(rows: list[tuple[str, int | None]]) -> list[str]:
    return [t for t, _ in rows if t and t.startswith("step ")]


def _last_step(rows: list[tuple[str, int | None]]) -> str | None:
    """The last step range a capture holds; None when it holds none."""
    steps = _steps(rows)
    return steps[-1] if steps else None


# Where a capture of a rank SIGKILLed in step 3 may end (None: not even step 0 was handed over).
_UP_TO_STEP_3 = {None, "step 0", "step 1", "step 2", "step 3"}
# How a rank that raises ends: Python's exit status 1, or SIGABRT when native code aborts while
# the interpreter exits with torch's and the profiler's threads still running (CI saw exit
# status 134 once, on the Slurm run); orch names either, with the exception. "" is a rank that
# torchrun stopped (SIGTERM) while nsys wrote its report, after rank 0, which lost its peer, had
# ended: then how it ended is not known, its exception is.
_RAISED = ("exit status 1", "killed by SIGABRT", "")


def _first_failure(line: str, ends: tuple[str, ...]) -> bool:
    """The outcome line names rank 1 as the first failure, ending in one of `ends`."""
    return any(line.startswith("failed (FAILED): rank 1 failed first" + (f" ({e}" if e else ": ")) for e in ends)


def test_hang_until_the_time_limit(tmp_path: Path, nsys: str, tree: JobTree) -> None:
    """Rank 1 hangs in step 3 before its backward; rank 0 waits in the all-reduce. The 90 s
    limit's warning (33 s ahead) stops both captures: both reports, with the unfinished step.
    The ranks get 57 s to reach the hang: on 2 busy cores, starting a rank and importing torch
    can take more than the 27 s a 60 s limit would leave, and a rank warned before its first
    NVTX range has none to show."""
    spec = _spec(tmp_path, ["--steps", "50", "--fault", "hang", "--fault-rank", "1", "--fault-step", "3"], "01:30")
    t0 = time.monotonic()
    p = tree.orch("submit", str(spec), "--wait", "--timeout", "200")
    took = time.monotonic() - t0
    assert p.returncode == 1, p.stdout + p.stderr
    assert "TIMEOUT" in p.stdout and p.stderr.strip().splitlines()[-1].endswith("TIMEOUT (2/2 reports)"), p.stderr
    assert took < 90 + 15, took  # the job ended at its limit, not at gloo's 30-minute timeout
    assert tree.survivors() == []
    reports = _reports(_run_dir(tmp_path))
    assert sorted(reports) == [0, 1]
    r0, r1 = _nvtx(reports[0]), _nvtx(reports[1])
    assert _steps(r1)[-1] == "step 3" and ("hang", r1[-1][1]) in r1  # open ranges kept, ended at the stop
    assert _steps(r0)[-1] == "step 3" and r0[-1][0] == "backward"

    rep = _report(tree, tmp_path)
    o = rep["outcome"]
    assert o["state"] == "hung" and o["scheduler_state"] == "TIMEOUT" and o["behind"] == [1], o
    assert o["line"].startswith("hung (TIMEOUT): rank(s) 1 never reached backward of step 3"), o["line"]
    ends = {r["rank"]: r for r in o["ranks"]}
    assert [ends[r]["last_done_step"] for r in (0, 1)] == [2, 2]  # the fault is planted in step 3
    assert ends[0]["open_ranges"] == ["step 3", "backward"] and ends[1]["open_ranges"] == ["step 3", "hang"]
    assert rep["findings"][0]["kind"] == "job_outcome" and rep["findings"][0]["ranks"] == [1]
    assert all(f["kind"] != "healthy" for f in rep["findings"])
    # Every rank's Python stack, dumped at the warning: rank 1 in the planted hang, rank 0 in its
    # backward's all-reduce.
    stacks = {r: (_run_dir(tmp_path) / "dumps" / f"stacks.r{r}.txt").read_text() for r in (0, 1)}
    assert 'in fault' in stacks[1] and "in backward" in stacks[0], stacks
    assert "dumps/stacks.r1.txt" in o["dumps"] and "dumps/flight_recorder/rank_1" in o["dumps"], o["dumps"]
    # PyTorch's Flight Recorder, dumped by the rank hook at the warning: rank 1 never entered the
    # all-reduce rank 0 waits in (DDP's gradient bucket, called from train.py's backward).
    (fr,) = o["flight_recorder"]
    assert re.match(r"Flight Recorder, process group \d+: rank\(s\) 1 never entered collective #\d+ "
                    r"\(gloo:all_reduce \[\[\d+\]\]\), which rank\(s\) 0 entered at .*train\.py:\d+ \(main\)", fr), fr
    assert ends[1]["stack"][0].startswith("fault (examples/train.py:"), ends[1]["stack"]
    # `hang` only happens in the unfinished step: were that step averaged in, it would be a phase.
    assert rep["cpu_phases"] and all(c["range"] != "hang" for c in rep["cpu_phases"])


def test_cancel_mid_run(tmp_path: Path, nsys: str, tree: JobTree) -> None:
    spec = _spec(tmp_path, ["--steps", "50", "--fault", "hang", "--fault-rank", "0", "--fault-step", "2"], "05:00")
    p = tree.orch("submit", str(spec))
    assert p.returncode == 0, p.stderr
    job = re.search(r"as job (\S+)", p.stdout).group(1)
    run = _run_dir(tmp_path)
    log = run / "submitit" / f"{job}_0_log.out"
    deadline = time.monotonic() + 120
    while "rank fault: hang" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "rank fault: hang" in log.read_text() and tree.survivors(settle_s=0)  # rank 0 hangs, the job runs
    c = tree.orch("cancel", job, "--runs", str(tmp_path / "runs"))
    assert c.returncode == 0 and f"job {job} cancelled" in c.stdout, c.stdout + c.stderr
    assert tree.survivors() == []
    st = json.loads(tree.orch("status", job, "--runs", str(tmp_path / "runs"), "--json").stdout)
    assert st["state"] == "CANCELLED", st
    reports = _reports(run)
    assert sorted(reports) == [0, 1]
    r0 = _nvtx(reports[0])
    assert ("hang", r0[-1][1]) in r0
    assert _steps(_nvtx(reports[1]))[-1] == "step 2"
    o = _report(tree, tmp_path)["outcome"]
    assert o["state"] == "hung" and o["scheduler_state"] == "CANCELLED" and o["behind"] == [0], o


def test_a_cancel_of_a_running_job_with_a_straggler_is_no_hang(tmp_path: Path, nsys: str, tree: JobTree) -> None:
    """Nothing hangs: rank 1 sleeps 300 ms in every data_load, so the cancel finds the ranks at
    different points (the Flight Recorder or the trace shows rank 1 behind). The report must say
    cancelled, name no rank as hung, and say that the rank behind was still running. (With 100 ms
    a full run once caught both ranks in the same step's backward: rank 1 spends the few ms
    after its sleep there, beside rank 0 waiting in the all-reduce; 300 ms makes that window a
    third as likely.)"""
    spec = _spec(tmp_path, ["--steps", "300", "--slow-rank", "1", "--slow-ms", "300", "--log-every", "1"], "05:00")
    p = tree.orch("submit", str(spec))
    assert p.returncode == 0, p.stderr
    job = re.search(r"as job (\S+)", p.stdout).group(1)
    run = _run_dir(tmp_path)
    # The cancel comes once both ranks have said they finished step 11 (the loop runs, however
    # busy the machine), not after a fixed time.
    log = run / "submitit" / f"{job}_0_log.out"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not all(
            f"rank {r} finished step 11" in (log.read_text() if log.exists() else "") for r in (0, 1)):
        time.sleep(0.5)
    assert tree.survivors(settle_s=0)  # the job runs
    c = tree.orch("cancel", job, "--runs", str(tmp_path / "runs"))
    assert c.returncode == 0 and f"job {job} cancelled" in c.stdout, c.stdout + c.stderr
    assert tree.survivors() == []
    assert sorted(_reports(run)) == [0, 1]
    rep = _report(tree, tmp_path)
    o = rep["outcome"]
    assert o["state"] == "cancelled" and o["scheduler_state"] == "CANCELLED" and o["behind"] == [], o
    assert "no rank hung: the stop found the ranks at different points of a running loop" in o["line"], o["line"]
    assert "never reached" not in o["line"], o["line"]
    ends = {r["rank"]: r for r in o["ranks"]}
    assert min(ends[r]["last_done_step"] for r in (0, 1)) >= 11, ends
    f = next(f for f in rep["findings"] if f["kind"] == "job_outcome")
    assert f["title"].startswith("the job was cancelled (CANCELLED)") and "never got as far" not in f["title"], f


@pytest.mark.parametrize(("fault", "words", "last", "exit_"), [
    ("raise", "RuntimeError: planted failure at step 3", {"step 3"}, _RAISED),
    # A SIGKILLed program loses the NVTX events nsys' injection had not yet handed over: its
    # capture ends in step 3 or earlier (CI has seen step 1), whatever the flush timing was.
    ("sigkill", "rank 1 failed first (killed by SIGKILL (exit status 137; out of memory?", _UP_TO_STEP_3,
     ("killed by SIGKILL",)),
])
def test_one_rank_fails(tmp_path: Path, nsys: str, tree: JobTree, fault: str, words: str, last: set[str],
                        exit_: tuple[str, ...]) -> None:
    """Rank 1 fails in step 3: torchrun stops rank 0, whose capture is stopped, not killed."""
    spec = _spec(tmp_path, ["--steps", "50", "--fault", fault, "--fault-rank", "1", "--fault-step", "3"], "05:00")
    p = tree.orch("submit", str(spec), "--wait", "--timeout", "200")
    assert p.returncode == 1 and "FAILED" in p.stdout, p.stdout + p.stderr
    assert words in " ".join(p.stdout.split()), p.stdout
    assert p.stderr.strip().splitlines()[-1].endswith("FAILED (2/2 reports)"), p.stderr
    assert tree.survivors() == []
    reports = _reports(_run_dir(tmp_path))
    r0 = _nvtx(reports[0])
    assert _steps(r0)[-1] == "step 3" and r0[-1][0] == "backward"
    got = _last_step(_nvtx(reports[1]))
    assert got in last
    rep = _report(tree, tmp_path)
    o = rep["outcome"]
    assert o["state"] == "failed", o
    assert _first_failure(o["line"], exit_) and words in o["line"], o["line"]
    line = o["line"]
    assert line.endswith(f"; its capture ends in {got}") if got else "its capture ends" not in line, line
    assert rep["findings"][0]["kind"] == "job_outcome" and all(f["kind"] != "healthy" for f in rep["findings"])


def test_a_process_the_program_left_behind_holds_no_report_back(tmp_path: Path, nsys: str, tree: JobTree) -> None:
    """Every rank starts a process that outlives it (a metrics uploader; on GPUs, a DataLoader
    worker blocked in a read): nsys does not wait for it before it writes the report, the rank
    ends with its program, and the node's supervisor stops what the programs left behind."""
    args = ["--steps", "50", "--fault", "raise", "--fault-rank", "1", "--fault-step", "3", "--uploader"]
    p = tree.orch("submit", str(_spec(tmp_path, args, "05:00")), "--wait", "--timeout", "200")
    assert p.returncode == 1 and "rank 1 failed first" in p.stdout, p.stdout + p.stderr
    assert p.stderr.strip().splitlines()[-1].endswith("FAILED (2/2 reports)"), p.stderr
    assert tree.survivors() == []
    log = next((_run_dir(tmp_path) / "submitit").glob("*_log.err")).read_text()
    assert "process(es) still running after the launch ended" in log, log
    assert _steps(_nvtx(_reports(_run_dir(tmp_path))[1]))[-1] == "step 3"


def _slurm_job_processes(job: str) -> list[int]:
    """Processes whose environment says they belong to Slurm job `job` (slurmstepd exports
    SLURM_JOB_ID to every task): on Slurm the job's processes are not the test's descendants."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                env = (d / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"SLURM_JOB_ID={job}".encode() in env:
                out.append(int(d.name))
    return out


@pytest.mark.slurm
def test_slurm_time_limit_keeps_every_report(tmp_path: Path, nsys: str, tree: JobTree, slurm_cluster) -> None:
    """2 nodes x 1 rank on the local Slurm, rank 1 hangs: Slurm's early warning (--signal,
    40 s before the 2-minute limit) stops both captures, on both nodes, before the limit. Slurm
    may send it up to a minute early (sbatch(1)), so the limit leaves the ranks 20 s or more to
    start; with a 1-minute limit CI once got it 0.2 s after the start, before any rank ran."""
    env = slurm_cluster.client_env
    spec = _spec(tmp_path, ["--steps", "50", "--fault", "hang", "--fault-rank", "1", "--fault-step", "3"], "2",
                 grace=25, lead=40, cluster="local-slurm", nproc=1)
    p = tree.orch("submit", str(spec), "--wait", "--timeout", "240", env=env)
    assert p.returncode == 1 and "TIMEOUT" in p.stdout, p.stdout + p.stderr
    assert p.stderr.strip().splitlines()[-1].endswith("TIMEOUT (2/2 reports)"), p.stderr
    job = re.search(r"as job (\S+)", p.stdout).group(1)
    deadline = time.monotonic() + 30
    while _slurm_job_processes(job) and time.monotonic() < deadline:
        time.sleep(1)
    assert _slurm_job_processes(job) == []
    reports = _reports(_run_dir(tmp_path))
    r0, r1 = _nvtx(reports[0]), _nvtx(reports[1])
    assert _steps(r1)[-1] == "step 3" and ("hang", r1[-1][1]) in r1
    assert _steps(r0)[-1] == "step 3" and r0[-1][0] == "backward"


def _slurm_gone(job: str, settle_s: float = 30) -> list[int]:
    """The job's processes still alive after up to `settle_s` (slurmstepd reaps after the step)."""
    deadline = time.monotonic() + settle_s
    while _slurm_job_processes(job) and time.monotonic() < deadline:
        time.sleep(1)
    return _slurm_job_processes(job)


@pytest.mark.slurm
@pytest.mark.parametrize("fault", ["raise", "sigkill", "cancel"])
def test_slurm_fault(tmp_path: Path, nsys: str, tree: JobTree, slurm_cluster, fault: str) -> None:
    """2 nodes x 1 rank on the local Slurm. raise/sigkill: rank 1 fails in step 3; srun's
    --kill-on-bad-exit stops node 0, whose capture is stopped, not killed. cancel: rank 0 hangs in
    step 2 and `orch cancel` sends the early warning first, so both captures are kept."""
    env = slurm_cluster.client_env
    runs = str(tmp_path / "runs")
    hang = fault == "cancel"
    args = ["--steps", "50", "--fault", "hang" if hang else fault, "--fault-rank", "0" if hang else "1",
            "--fault-step", "2" if hang else "3"]
    spec = _spec(tmp_path, args, "5", grace=25, lead=40, cluster="local-slurm", nproc=1)
    p = tree.orch("submit", str(spec), *([] if hang else ["--wait", "--timeout", "240"]), env=env)
    job = re.search(r"as job (\S+)", p.stdout).group(1)
    run = _run_dir(tmp_path)
    if hang:
        assert p.returncode == 0, p.stderr
        log = run / "submitit" / f"{job}_0_log.out"
        deadline = time.monotonic() + 180
        while "rank fault: hang" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
            time.sleep(0.5)
        assert "rank fault: hang" in log.read_text(), log.read_text()
        assert _slurm_job_processes(job)  # the job runs, rank 0 hangs
        c = tree.orch("cancel", job, "--runs", runs, env=env)
        assert c.returncode == 0 and f"job {job} cancelled" in c.stdout, c.stdout + c.stderr
    else:
        assert p.returncode == 1 and "FAILED" in p.stdout, p.stdout + p.stderr
    assert _slurm_gone(job) == []
    st = json.loads(tree.orch("status", job, "--runs", runs, "--json", env=env).stdout)
    assert st["state"] == ("CANCELLED" if hang else "FAILED"), st
    reports = _reports(run)
    assert sorted(reports) == [0, 1], st
    r0, r1 = _nvtx(reports[0]), _nvtx(reports[1])
    o = _report(tree, tmp_path)["outcome"]
    if hang:
        assert ("hang", r0[-1][1]) in r0 and _steps(r0)[-1] == "step 2"
        assert _steps(r1)[-1] == "step 2" and r1[-1][0] == "backward"
        assert o["state"] == "hung" and o["scheduler_state"] == "CANCELLED" and o["behind"] == [0], o
        assert o["line"].startswith("hung (CANCELLED): rank(s) 0 never reached backward of step 2"), o["line"]
        ends = {r["rank"]: r for r in o["ranks"]}
        assert [ends[r]["last_done_step"] for r in (0, 1)] == [1, 1], ends
        return
    assert _steps(r0)[-1] == "step 3" and r0[-1][0] == "backward"
    got = _last_step(r1)
    assert got in ({"step 3"} if fault == "raise" else _UP_TO_STEP_3)
    assert o["state"] == "failed" and o["scheduler_state"] == "FAILED", o
    assert _first_failure(o["line"], _RAISED if fault == "raise" else ("killed by SIGKILL",)), o["line"]
    assert fault != "raise" or "RuntimeError: planted failure at step 3" in o["line"], o["line"]
    assert (f"; its capture ends in {got}" in o["line"] if got else "its capture ends" not in o["line"]), o["line"]


@pytest.mark.slurm
def test_slurm_a_node_slower_to_end_than_killwait_keeps_its_report(tmp_path: Path, nsys: str, tree: JobTree,
                                                                  slurm_cluster) -> None:
    """2 nodes x 1 rank, batches from a DataLoader with 2 forked workers, rank 1 SIGKILLed in step
    3. Rank 0 raises on the lost connection at once but its program ends seconds later (the
    loader's teardown), later than the local Slurm's KillWait (5 s) after srun ends the step
    (--kill-on-bad-exit): the failed node's task waits for node 0 to stop its capture before it
    fails, so node 0's report is kept, and its stop says why."""
    env = slurm_cluster.client_env
    args = ["--steps", "50", "--fault", "sigkill", "--fault-rank", "1", "--fault-step", "3", "--loader-workers", "2"]
    spec = _spec(tmp_path, args, "5", grace=25, lead=40, cluster="local-slurm", nproc=1)
    p = tree.orch("submit", str(spec), "--wait", "--timeout", "240", env=env)
    assert p.returncode == 1 and "FAILED" in p.stdout, p.stdout + p.stderr
    job = re.search(r"as job (\S+)", p.stdout).group(1)
    assert _slurm_gone(job) == []
    run = _run_dir(tmp_path)
    reports = _reports(run)
    assert sorted(reports) == [0, 1], (run / "submitit" / f"{job}_0_log.err").read_text()[-3000:]
    assert _steps(_nvtx(reports[0]))[-1] == "step 3"
    o = _report(tree, tmp_path)["outcome"]
    assert o["state"] == "failed" and o["scheduler_state"] == "FAILED", o
    assert _first_failure(o["line"], ("killed by SIGKILL",)), o["line"]
    stop = run / "submitit" / f"{job}_0_stop.json"
    if stop.exists():  # node 0 was stopped on node 1's failure (on a loaded machine its program may end first)
        assert json.loads(stop.read_text())["reason"] == "step_ended", stop.read_text()
        assert "orch stopped the captures at Slurm's end of the step (another node failed)" in o["line"], o["line"]


def test_a_warning_before_the_handlers_stops_the_node_cleanly(tmp_path: Path, nsys: str) -> None:
    """Slurm may send the early warning up to a minute before it is due, so a short job can get
    it while launch.sh is still starting. Held there (a slow `scontrol`, as on a loaded
    controller), launch.sh gets SIGUSR2 before its stop handlers are set: it must not die of it,
    and must stop the node once they are, starting no rank."""
    spec = _spec(tmp_path, ["--steps", "50"], "05:00")
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli", "render", str(spec), "-o", str(tmp_path / "r")],
                       capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 0, r.stderr
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text("#!/bin/sh\nsleep 3\necho 127.0.0.1\n")
    (fake / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "SLURM_JOB_NODELIST": "n1", "SLURM_NNODES": "1",
           "SLURM_NODEID": "0", "ORCH_JOB_ID": "77"}
    launch = subprocess.Popen(["bash", str(tmp_path / "r" / "scripts" / "launch.sh")], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    time.sleep(1)  # in the fake scontrol
    launch.send_signal(signal.SIGUSR2)
    out, err = launch.communicate(timeout=120)
    assert launch.returncode >= 0, f"launch.sh died of signal {-launch.returncode}: {err}"
    assert "orch: node 0: time-limit warning (SIGUSR2): stack dumps, then stopping the captures" in err, err
    assert "step 0" not in out + err  # no rank trained
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "r" / "scripts")], capture_output=True, text=True)
    assert left.stdout == "", left.stdout  # nothing of the node outlives it
