"""On a 1-GPU machine: a CUDA loop (matmuls, an NVTX range per step) under orch's rendered rank
wrapper with that machine's nsys, signalled while nsys writes the report, the way Slurm ends a
step: SIGTERM to nsys, or SIGKILL to nsys, its agent and the agent's importer. Prints, per case,
whether the report exists, what the wrapper said, and the steps and kernels in it (sqlite3 over
nsys' own export), against an unsignalled capture of the same loop.

    python3 keep_report_gpu.py SCRIPTS_DIR NSYS OUT_JSON   (SCRIPTS_DIR: `orch render` output)
"""
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

STEPS = 2000
PROGRAM = f"""
import sys, torch
x = torch.randn(1024, 1024, device="cuda")
for i in range({STEPS}):
    torch.cuda.nvtx.range_push(f"step {{i}}")
    for _ in range(10):
        x = torch.tanh(x @ x)
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
"""


def capture_processes(nsys_pid: int, tmp: Path) -> list[int]:
    found = [nsys_pid]
    for d in Path("/proc").iterdir():
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if d.name.isdigit() and int(d.name) != nsys_pid and (
                (f"-{nsys_pid} " in cmd and "--start-agent" in cmd) or str(tmp) in cmd):
            found.append(int(d.name))
    return found


def case(scripts: Path, nsys: str, work: Path, name: str) -> dict:
    d = work / name
    ctl, tmp = d / "ctl", d / "tmp"  # nsys' TMPDIR: its raw stream goes there
    ctl.mkdir(parents=True)
    tmp.mkdir()
    prog = d / "prog.py"
    prog.write_text(PROGRAM)
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "ORCH_JOB_ID": name, "ORCH_CTL_DIR": str(ctl),
           "TMPDIR": str(tmp)}
    log = d / "wrapper.log"
    t0 = time.monotonic()
    with open(log, "w") as fh:
        p = subprocess.Popen(["bash", str(scripts / "rank_wrapper.sh"), sys.executable, str(prog)], env=env,
                             stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    res: dict = {"case": name}
    if name != "none":
        while "Generating" not in log.read_text() and p.poll() is None and time.monotonic() - t0 < 300:
            time.sleep(0.01)
        pid = int((ctl / "nsys.r0.pid").read_text())
        res["tmp_at_signal"] = sorted(x.name for x in tmp.iterdir())
        pids = [pid] if name == "term" else capture_processes(pid, tmp)
        res["signalled"] = [Path(f"/proc/{x}/cmdline").read_bytes().split(b"\0")[0].decode()[-40:] for x in pids
                            if Path(f"/proc/{x}/cmdline").exists()]
        for x in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(x, signal.SIGTERM if name == "term" else signal.SIGKILL)
    res["wrapper_rc"] = p.wait(timeout=600)
    res["wall_s"] = round(time.monotonic() - t0, 1)
    res["log_orch_lines"] = [ln for ln in log.read_text().splitlines() if ln.startswith("orch:")]
    reports = sorted(Path("/tmp/kr/reports").glob(f"keep_{name}_r0_*.nsys-rep"))
    res["reports"] = [(r.name, r.stat().st_size) for r in reports]
    res["left_in_tmp"] = sorted(x.name for x in tmp.iterdir())
    if len(reports) == 1:
        res.update(counts(nsys, reports[0], d / "r.sqlite"))
    return res


def counts(nsys: str, report: Path, db: Path) -> dict:
    """The closed `step N` ranges and the kernels of a report, by sqlite3 over nsys' own export."""
    e = subprocess.run([nsys, "export", "--type", "sqlite", "-o", str(db), str(report)], capture_output=True, text=True)
    res = {"export_rc": e.returncode}
    with sqlite3.connect(db) as c:
        res["steps"] = c.execute("SELECT count(*) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                                 "WHERE coalesce(e.text, s.value) LIKE 'step %' AND e.\"end\" IS NOT NULL"
                                 ).fetchone()[0]
        res["kernels"] = c.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    return res


def run_cases(case, names: tuple[str, ...], work: Path) -> None:
    """`case(SCRIPTS_DIR, NSYS, work, name)` for each name, from this script's arguments; the results
    go to OUT_JSON and standard output."""
    scripts, nsys, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    work.mkdir(parents=True, exist_ok=True)
    results = [case(scripts, nsys, work, n) for n in names]
    out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


def main() -> None:
    run_cases(case, ("none", "term", "kill"), Path("/tmp/kr/work"))


if __name__ == "__main__":
    main()
