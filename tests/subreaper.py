"""A test's own subreaper: the oracle for "no process of the job survives".

Run as a child of the test (`JobTree`), it sets PR_SET_CHILD_SUBREAPER and runs the orch commands
it is sent as its children. Everything those commands start (the submitit controller that
`orch submit` leaves running, torchrun, the ranks, nsys and its daemon, whatever setsid or
double-fork they do) stays its descendant, so what survived is read from /proc's parent links
by pid, independently of orch's own bookkeeping and never by a process name.

Protocol: one JSON object per line on stdin, one reply per line on stdout:
  {"run": [argv...], "env": {...}, "timeout": s} -> {"rc", "stdout", "stderr"}
  {"survivors": true}                            -> {"pids": [[pid, cmdline], ...]}
  {"kill": true}                                 -> {"killed": n}   (SIGKILL to every descendant)
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def survivors() -> list[tuple[int, str]]:
    _reap()
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                state, ppid = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[:2]
            except (OSError, ValueError):
                continue
            if state != "Z":
                kids.setdefault(int(ppid), []).append(int(d))
    out, todo = [], [os.getpid()]
    while todo:
        for pid in kids.get(todo.pop(), []):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                cmd = "?"
            out.append((pid, cmd.strip()[:300]))
            todo.append(pid)
    return out


def main() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    for line in sys.stdin:
        req = json.loads(line)
        if "run" in req:
            # Files, not pipes: a process the command leaves running (the submitit controller)
            # keeps its output open, and a pipe would hold the reply until it ends.
            with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
                p = subprocess.run(req["run"], stdout=out, stderr=err, text=True, timeout=req.get("timeout", 600),
                                   env={**os.environ, **req.get("env", {})}, check=False)
                out.seek(0)
                err.seek(0)
                reply: dict = {"rc": p.returncode, "stdout": out.read(), "stderr": err.read()}
        elif "survivors" in req:
            reply = {"pids": survivors()}
        else:
            left = survivors()
            for pid, _ in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
            _reap()
            reply = {"killed": len(left)}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    main()
