"""On a 1-GPU machine: a CUDA loop (matmuls, an NVTX range per step, about 15 s) under orch's
rendered rank wrapper with that machine's nsys, whose agent is stopped 4 s into the program
(SIGTERM, then a second case with SIGKILL), against an undisturbed capture of the same loop.
Prints, per case, the processes of the capture when the agent was stopped, what the wrapper
said, its exit status, whether it ended after the program (the program writes its end time),
and the report and its steps and kernels (sqlite3 over nsys' own export) when there is one.

    python3 agent_lost_gpu.py SCRIPTS_DIR NSYS OUT_JSON   (SCRIPTS_DIR: `orch render -o DIR` of a
    job named `lost`, export_in_job off; its reports go to DIR/reports)
"""
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from keep_report_gpu import counts, run_cases  # beside this script

PROGRAM = """
import sys, time, torch
cuda = torch.cuda.is_available()  # CPU only to rehearse this script
x = torch.randn(1024, 1024, device="cuda" if cuda else "cpu")
t_end = time.time() + 15
i = 0
while time.time() < t_end:
    if cuda:
        torch.cuda.nvtx.range_push(f"step {i}")
    for _ in range(10):
        x = torch.tanh(x @ x)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
    i += 1
open(sys.argv[1], "w").write(f"{time.time()} {i}")
"""


def capture_processes(nsys_pid: int) -> dict[int, str]:
    """Every process whose command line names the capture's session (nsys 2022.4:
    `profile-<program>-<nsys pid>`, 2025: `profile-<nsys pid>`) or is that nsys."""
    name = re.compile(rf"(^|[ =])profile-(\S*-)?{nsys_pid}( |$)")
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if int(d.name) == nsys_pid or name.search(cmd):
            found[int(d.name)] = cmd[:200]
    return found


def case(scripts: Path, nsys: str, work: Path, name: str) -> dict:
    d = work / name
    ctl = d / "ctl"
    ctl.mkdir(parents=True)
    prog, ended = d / "prog.py", d / "ended"
    prog.write_text(PROGRAM)
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "ORCH_JOB_ID": name, "ORCH_CTL_DIR": str(ctl),
           "ORCH_STOP_GRACE_S": "5"}
    log = d / "wrapper.log"
    t0 = time.monotonic()
    with open(log, "w") as fh:
        p = subprocess.Popen(["bash", str(scripts / "rank_wrapper.sh"), sys.executable, str(prog), str(ended)],
                             env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    res: dict = {"case": name}
    if name != "none":
        while not (ctl / "app.r0.pid").exists() and p.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.05)
        time.sleep(4)
        nsys_pid = int((ctl / "nsys.r0.pid").read_text())
        procs = capture_processes(nsys_pid)
        res["processes_at_signal"] = procs
        agents = [pid for pid, cmd in procs.items() if pid != nsys_pid and "--start-agent" in cmd] or \
                 [pid for pid, cmd in procs.items() if pid != nsys_pid]
        res["signalled"] = agents[:1]
        for pid in agents[:1]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM if name == "agent_term" else signal.SIGKILL)
    res["wrapper_rc"] = p.wait(timeout=600)
    wrapper_end = time.time()
    res["wall_s"] = round(time.monotonic() - t0, 1)
    if ended.exists():
        t, steps = ended.read_text().split()
        res["program_steps"] = int(steps)
        res["wrapper_ended_after_program_s"] = round(wrapper_end - float(t), 2)
    res["log_orch_lines"] = [ln for ln in log.read_text().splitlines() if ln.startswith("orch:")]
    res["log_nsys_lines"] = [ln for ln in log.read_text().splitlines()
                             if "Agent" in ln or "rror" in ln][:10]
    reports = sorted((scripts.parent / "reports").glob(f"lost_{name}_r0_*.nsys-rep"))
    res["reports"] = [(r.name, r.stat().st_size) for r in reports]
    if len(reports) == 1:
        res.update(counts(nsys, reports[0], d / "r.sqlite"))
    time.sleep(1)
    res["left_running"] = [c for c in _cmdlines() if str(prog) in c]
    return res


def _cmdlines() -> list[str]:
    out = []
    for d in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if d.name.isdigit():
                out.append((d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
    return out


def main() -> None:
    run_cases(case, ("none", "agent_term", "agent_kill"), Path("/tmp/al/work"))


if __name__ == "__main__":
    main()
