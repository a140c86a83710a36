"""How long nsys needs, after it is asked to stop, to finish its report: the number that
profile.stop_grace_s must cover (docs/failing_jobs.md).

For each capture size a program emits N NVTX ranges, then waits to be stopped: on CPU each range
is around an `os.stat`, traced by osrt (about 2 events per range); with `--cuda` each is around a
small CUDA kernel launch, traced by cuda (a range, an API call and a kernel per range). nsys runs
in a session of its own and is sent SIGTERM, as orch's rank wrapper does at a time limit or a
cancel; the time measured is from that signal to nsys' exit with a complete .nsys-rep. Not a
test: the numbers depend on the machine (and on how busy it is).

    python scripts/bench_stop_grace.py [--sizes 10000,100000,1000000] [--out DIR] [--cuda] [--nsys PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_PROGRAM = """\
import nvtx, os, sys, time
n = int(sys.argv[1])
for i in range(n):
    nvtx.push_range("r")
    os.stat("/")
    nvtx.pop_range()
open(sys.argv[2], "w").close()
while True:
    time.sleep(1)
"""


_CUDA_PROGRAM = """\
import sys, time, torch
n = int(sys.argv[1])
x = torch.zeros(1, device="cuda")
for i in range(n):
    torch.cuda.nvtx.range_push("r")
    x.add_(1)
    torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
open(sys.argv[2], "w").close()
while True:
    time.sleep(1)
"""


def measure(nsys: str, n: int, work: Path, cuda: bool = False) -> dict[str, float | int | str]:
    """One capture of `n` ranges: seconds to emit them, and from SIGTERM to the report."""
    prog, ready, out = work / "emit.py", work / f"ready.{n}", work / f"grace_{n}"
    prog.write_text(_CUDA_PROGRAM if cuda else _PROGRAM)
    ready.unlink(missing_ok=True)
    t0 = time.monotonic()
    trace = "--trace=cuda,nvtx" if cuda else "--trace=nvtx,osrt"
    p = subprocess.Popen([nsys, "profile", trace, "--sample=none", "--cpuctxsw=none",
                          "--force-overwrite=true", "-o", str(out), sys.executable, str(prog), str(n),
                          str(ready)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    while not ready.exists():
        if p.poll() is not None:
            raise RuntimeError(f"nsys ended before the program was done: {p.stderr.read()[-2000:]}")
        time.sleep(0.05)
    emitted = time.monotonic() - t0
    tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    raw = sorted(tmp.glob("nsys-report-*.qdstrm"), key=lambda q: q.stat().st_mtime)
    raw_mb = raw[-1].stat().st_size / 1e6 if raw else 0.0
    t1 = time.monotonic()
    os.kill(p.pid, signal.SIGTERM)
    p.wait(timeout=3600)
    stop_s = time.monotonic() - t1
    rep = out.with_suffix(".nsys-rep")
    res: dict[str, float | int | str] = {
        "ranges": n, "emit_s": round(emitted, 2), "stop_to_report_s": round(stop_s, 2),
        "qdstrm_mb_at_stop": round(raw_mb, 1),
        "report_mb": round(rep.stat().st_size / 1e6, 1) if rep.exists() else 0.0, "nsys_rc": p.returncode}
    if not rep.exists():
        res["nsys_stderr"] = (p.stderr.read() if p.stderr else "")[-1500:]
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--out", type=Path, default=None, help="where the reports go (a temp dir if unset)")
    ap.add_argument("--cuda", action="store_true", help="a CUDA kernel per range (torch on a GPU)")
    ap.add_argument("--nsys", default=None, help="the nsys binary (default: the one on PATH)")
    a = ap.parse_args()
    nsys = a.nsys or shutil.which("nsys")
    if not nsys:
        sys.exit("nsys not found")
    work = a.out or Path(tempfile.mkdtemp(prefix="orch-grace-"))
    work.mkdir(parents=True, exist_ok=True)
    for n in (int(s) for s in a.sizes.split(",")):
        print(json.dumps(measure(nsys, n, work, a.cuda)), flush=True)
    if a.out is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
