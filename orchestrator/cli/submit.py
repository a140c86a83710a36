"""`orch submit`, `orch status`, `orch cancel`: the submit stage."""

from __future__ import annotations

import argparse
import json
import shlex
import signal
import time
from pathlib import Path
from typing import Any

from orchestrator.cli.common import Handler, err, out, positive_float, run_arg, runs_opt


def cmd_submit(a: argparse.Namespace) -> int:
    from orchestrator.spec import load_job
    from orchestrator.submit.core import submit

    job = load_job(a.job)
    run, m = submit(job, Path(a.runs) if a.runs else None)
    out.print(f"submitted {m.name} as job {m.job_id} ({m.executor}, {m.nodes} node(s) x "
              f"{m.nproc_per_node}); run directory {run}", markup=False)
    ref = _ref(run, m.job_id)
    if not a.wait:
        out.print(f"next: orch status {ref}   then: orch collect {ref}", markup=False)
        return 0
    return _wait_and_summarize(run, m.job_id, ref, a.timeout)


def _ref(run: Path, job_id: str) -> str:
    """How the next commands (`orch status`, `orch cancel`, `orch collect`) find this run from
    here: its job id where the default run root ($ORCH_RUNS, ./orch-runs) holds it, else its
    directory (a spec's `run_root`, `--runs`, another working directory)."""
    from orchestrator.errors import OrchError
    from orchestrator.rundir import find_run

    try:
        found = find_run(job_id)
    except OrchError:
        found = None
    return job_id if found is not None and found.resolve() == run.resolve() else shlex.quote(str(run))


def _wait_and_summarize(run: Path, job_id: str, ref: str, timeout: float | None) -> int:
    """Follow the job to its end and print its status; Ctrl-C as with srun (`_CtrlC`). `ref`
    names the job to the commands suggested (`_ref`)."""
    from orchestrator.submit.core import wait

    last: dict[str, Any] = {"line": None, "state": "submitted"}

    def show(st: dict[str, Any]) -> None:
        found = sum(1 for v in st["reports"].values() if v)
        line = f"job {st['job_id']}: {st['state']} ({found}/{len(st['profiled_ranks'])} reports)"
        last["state"] = st["state"]
        if line != last["line"]:
            err.print(line, markup=False)
            last["line"] = line

    with _CtrlC() as ctrl_c:
        try:
            st = wait(run, show, timeout_s=timeout)
        except KeyboardInterrupt:
            return _interrupted_wait(run, job_id, ref, last["state"], ctrl_c)
    print_status(st)
    return 0 if st["state"] == "COMPLETED" else 1


class _CtrlC:
    """SIGINT while `orch submit --wait` follows a job, taken as srun takes it: the first Ctrl-C
    stops the wait (KeyboardInterrupt) and the job goes on; another within a second cancels it.
    Later presses are only counted, unless `raising` (while a cancel is waited for): raised,
    one could land inside the message that explains the one before and end orch without it."""

    WINDOW_S = 1.0

    def __init__(self) -> None:
        self.presses: list[float] = []
        self.raising = False
        self._previous: Any = None

    def __call__(self, _signum: int, _frame: Any) -> None:
        self.presses.append(time.monotonic())
        if len(self.presses) == 1 or self.raising:
            raise KeyboardInterrupt

    def __enter__(self) -> _CtrlC:
        self._previous = signal.signal(signal.SIGINT, self)
        return self

    def __exit__(self, *exc: Any) -> None:
        signal.signal(signal.SIGINT, self._previous)

    def again(self) -> bool:
        """Wait out the second after the first press; whether another came within it."""
        end = self.presses[0] + self.WINDOW_S
        while len(self.presses) < 2 and time.monotonic() < end:
            time.sleep(0.02)
        return len(self.presses) > 1 and self.presses[1] <= end


def _interrupted_wait(run: Path, job_id: str, ref: str, state: str, ctrl_c: _CtrlC) -> int:
    """After the first Ctrl-C: say what becomes of the job and how to stop it; cancel it on a
    second Ctrl-C within the second, else leave it as it is. Exit status 130 either way (the
    command was interrupted; the job's own outcome is `orch status`'s)."""
    err.print(f"orch: job {job_id} goes on; a second Ctrl-C within 1 s cancels it (captures kept)", markup=False)
    if not ctrl_c.again():
        err.print(f"orch: stopped following job {job_id}, left {state}; orch status {ref} follows it, "
                  f"orch cancel {ref} stops it", markup=False)
        return 130
    return _cancel_now(run, job_id, ref, ctrl_c)


def _cancel_now(run: Path, job_id: str, ref: str, ctrl_c: _CtrlC) -> int:
    """The second Ctrl-C: `orch cancel`'s orderly stop (captures first, reports kept). A Ctrl-C
    during it stops only the waiting for it, and says what the job is left in and how to end it."""
    from orchestrator.submit.backend import TERMINAL
    from orchestrator.submit.core import cancel, job_status

    err.print(f"orch: cancelling job {job_id}: its captures are stopped first, then its processes", markup=False)
    try:
        ctrl_c.raising = True
        m, killed = cancel(run)
        ctrl_c.raising = False  # inside the try: a press up to here is one during the cancel
    except KeyboardInterrupt:
        ctrl_c.raising = False
        st = job_status(run)
        if st["state"] in TERMINAL:
            err.print(f"orch: stopped waiting for the cancel of job {job_id}, now {st['state']}", markup=False)
        elif st.get("stop"):
            err.print(f"orch: stopped waiting for the cancel of job {job_id}, still {st['state']} while its "
                      f"captures stop; orch cancel {ref} waits for the stop to end", markup=False)
        else:
            err.print(f"orch: the cancel of job {job_id} was interrupted before its stop began, still "
                      f"{st['state']}; orch cancel {ref} stops it", markup=False)
        return 130
    out.print(_cancelled(m.job_id, killed), markup=False)
    print_status(job_status(run))
    return 130


def _cancelled(job_id: str, killed: list[str]) -> str:
    return (f"job {job_id} cancelled: captures stopped, then its processes"
            + (f"; killed {len(killed)} that outlived the stop (pids {', '.join(killed)})" if killed else ""))


def print_status(st: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from orchestrator.submit.backend import TERMINAL

    out.print(f"job {escape(st['job_id'])} ({escape(st['name'])}, {st['executor']}): [bold]{st['state']}[/bold] "
              f"(from {escape(st['source'])})")
    stop = st.get("stop")
    if stop:  # orch's node supervisor stopped it: say why and when
        why = {"timeout": "at the time limit's early warning", "cancelled": "on a cancel",
               "step_ended": "when Slurm ended the step (another node failed)"}.get(stop.get("reason"))
        out.print(f"stopped by orch{' ' + why if why else ''} ({stop.get('signal', '?')}) after "
                  f"{stop.get('after_s', '?')} s: "
                  "captures first, then the ranks", markup=False)
    t = Table(title="tasks (one per node)")
    for c in ("task", "result", "error"):
        t.add_column(c)
    for task in st["tasks"]:
        t.add_row(str(task["task"]), escape(task["result"]), escape(task.get("error", "")))
    out.print(t)
    for task in st["tasks"]:
        if task.get("log_tail"):
            what = {"traceback": "- the failing rank's traceback", "orch": "- orch's lines"}.get(
                task.get("log_kind", ""), "log tail")
            out.print(f"--- task {task['task']} {what} ({task['stderr']}):", markup=False)
            out.print(task["log_tail"], markup=False)
    for rank, grace in exit_ended(st).items():
        out.print(f"rank {rank}: its program finished but did not exit: orch ended it {grace} s later "
                  f"(profile.exit_grace_s; every thread's stack: dumps/stacks.r{rank}.txt)", markup=False)
    none = "no report (its task's log says why)" if st["state"] in TERMINAL else "no report yet"
    for rank in st["profiled_ranks"]:
        files = st["reports"].get(rank) or st["reports"].get(str(rank)) or []
        out.print(f"rank {rank}: " + (", ".join(Path(f).name for f in files) if files else none), markup=False)


def exit_ended(st: dict[str, Any]) -> dict[int, int]:
    """The ranks whose program finished and whose process orch ended, each with the grace it had
    (profile.exit_grace_s): what the job's dumps/ folder records."""
    from orchestrator.runpaths import RunPaths
    from orchestrator.submit.evidence import exit_hangs

    if not st.get("run"):
        return {}
    return {r: h.grace_s for r, h in sorted(exit_hangs(RunPaths(Path(st["run"])).dumps).items())}


def cmd_status(a: argparse.Namespace) -> int:
    from orchestrator.submit.core import job_status

    st = job_status(run_arg(a))
    if a.json:
        out.print_json(json.dumps({**st, "exit_ended": exit_ended(st)}, default=str))
    else:
        print_status(st)
    return 0


def cmd_cancel(a: argparse.Namespace) -> int:
    from orchestrator.submit.core import cancel

    m, killed = cancel(run_arg(a))
    out.print(_cancelled(m.job_id, killed), markup=False)
    return 0


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:
    p = sub.add_parser("submit", help="render and submit a job (Slurm or local) through submitit")
    p.add_argument("job")
    p.add_argument("--wait", action="store_true", help="follow the job and print the summary at the end")
    p.add_argument("--timeout", type=positive_float("--timeout 600"), default=None,
                   help="stop waiting after this many seconds")
    runs_opt(p)
    p = sub.add_parser("status", help="job state per task, profiled ranks, reports written so far")
    p.add_argument("run", help="job id or run directory")
    p.add_argument("--json", action="store_true")
    runs_opt(p)
    p = sub.add_parser("cancel", help="cancel a submitted job")
    p.add_argument("run", help="job id or run directory")
    runs_opt(p)
    return {"submit": cmd_submit, "status": cmd_status, "cancel": cmd_cancel}
