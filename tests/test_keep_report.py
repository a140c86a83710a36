"""A capture whose nsys is signalled while it writes the report, the way Slurm ends a step: a
SIGTERM to every process (srun --kill-on-bad-exit, scancel, the time limit) aborts nsys 2022.4's
report and deletes its raw stream; a SIGKILL to the processes writing it leaves none. The
rendered rank wrapper kept the stream (a hard link) and keep_report.sh makes the report with
nsys' own QdstrmImporter. Real nsys, real signals; the ranges are counted with sqlite3 over
nsys' own export and compared with what the program recorded."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.render import render
from orchestrator.spec import load_job

pytestmark = [pytest.mark.jobs, pytest.mark.nsys]

RANGES = 20000
PROGRAM = f"""
import nvtx
for i in range({RANGES}):
    with nvtx.annotate("work"):
        pass
"""


def _rendered(tmp_path: Path) -> Path:
    (tmp_path / "prog.py").write_text(PROGRAM)
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(yaml.safe_dump({"name": "t", "executor": "local", "gpu": {"model": "H100", "per_node": 1},
                                       "nsys": {"path": "nsys", "version": "2022.4"}}))
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "keep", "cluster": str(cluster),
        "launch": {"script": str(tmp_path / "prog.py"), "nproc_per_node": 1},
        "profile": {"ranks": "all", "trace": ["nvtx"]},
    }))
    r = render(load_job(spec), tmp_path / "scripts", report_dir=tmp_path / "reports")
    r.write()
    return r.script_dir / "rank_wrapper.sh"


def _started(tmp_path: Path, program: str, job: str) -> tuple[subprocess.Popen, Path, Path, Path]:
    """The rendered wrapper running `python tmp_path/program` as rank 0 of job `job`, in a session of
    its own: (the process, its log, ORCH_CTL_DIR, nsys' TMPDIR, where its raw stream goes)."""
    wrapper = _rendered(tmp_path)
    ctl, tmp = tmp_path / "ctl", tmp_path / "tmp"
    for d in (ctl, tmp):
        d.mkdir()
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "ORCH_JOB_ID": job, "ORCH_CTL_DIR": str(ctl),
           "TMPDIR": str(tmp)}
    log = tmp_path / "wrapper.log"
    with open(log, "w") as fh:
        p = subprocess.Popen(["bash", str(wrapper), sys.executable, str(tmp_path / program)],
                             env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    return p, log, ctl, tmp


def _writers(nsys_pid: int, tmp: Path) -> list[int]:
    """nsys and the QdstrmImporter its agent runs on the stream: the processes writing the
    report. The agent itself is left alive: nsys 2022.4's agent killed by SIGKILL leaves its
    session table in /dev/shm locked, and every later nsys on the machine fails to start."""
    found = [nsys_pid]
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if d.name.isdigit() and "QdstrmImporter" in cmd and str(tmp) in cmd:
            found.append(int(d.name))
    return found


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_report_made_from_the_kept_stream_when_nsys_is_signalled_while_writing(
        tmp_path: Path, nsys: str, sig: signal.Signals) -> None:
    p, log, ctl, tmp = _started(tmp_path, "prog.py", "4244")
    deadline = time.monotonic() + 120
    while "Generating" not in log.read_text() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "Generating" in log.read_text(), log.read_text()
    nsys_pid = int((ctl / "nsys.r0.pid").read_text())
    pids = [nsys_pid]
    while sig == signal.SIGKILL and len(pids) < 2 and time.monotonic() < deadline:
        pids = _writers(nsys_pid, tmp)  # once the agent's importer has started
    for pid in pids:
        os.kill(pid, sig)  # what slurmstepd sends the processes of the step it ends
    assert p.wait(timeout=120) is not None
    out = log.read_text()
    reports = list((tmp_path / "reports").glob("keep_4244_r0_*.nsys-rep"))
    assert len(reports) == 1, (out, reports)
    assert "made it from the raw stream with QdstrmImporter" in out, out
    assert not list(tmp.glob("*.qdstrm")) and not list(tmp.glob("orch-kept-*"))  # nothing left behind
    assert not list(ctl.iterdir())
    db = tmp_path / "r.sqlite"
    e = subprocess.run([nsys, "export", "--type", "sqlite", "-o", str(db), str(reports[0])],
                       capture_output=True, text=True, timeout=300)
    assert e.returncode == 0, e.stderr
    with sqlite3.connect(db) as c:
        (n,) = c.execute("SELECT count(*) FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
                         "WHERE s.value = 'work' AND e.\"end\" IS NOT NULL").fetchone()
    assert n == RANGES


def test_a_stop_after_the_program_ended_keeps_its_exit_status(tmp_path: Path, nsys: str) -> None:
    """The program dies by SIGKILL; while its wrapper exports the report, torchrun, which saw
    another rank fail (the one that lost its connection to this one), stops the wrapper with
    SIGTERM. The wrapper ends with its program's status (137), not the stop's: torchrun's
    failure list is how `orch status` tells the killed rank from the one that lost its peer."""
    ran = tmp_path / "ran"
    (tmp_path / "killed.py").write_text(f"import os, signal\nopen({str(ran)!r}, 'w').close()\n"
                                        "os.kill(os.getpid(), signal.SIGKILL)\n")
    p, log, ctl, _ = _started(tmp_path, "killed.py", "4245")
    pid_file, deadline = ctl / "nsys.r0.pid", time.monotonic() + 120
    # The wrapper writes the pid file as it starts nsys and removes it once nsys has exited,
    # before the export; the attempt that counts is the one whose program ran (nsys 2022.4 may
    # fail to start it first, under load: the wrapper then starts it again).
    while not (ran.exists() and not pid_file.exists()) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert p.poll() is None, log.read_text()  # still exporting
    os.kill(p.pid, signal.SIGTERM)
    assert p.wait(timeout=120) == 137, log.read_text()
    assert len(list((tmp_path / "reports").glob("keep_4245_r0_*.nsys-rep"))) == 1, log.read_text()
