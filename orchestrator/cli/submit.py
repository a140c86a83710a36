"""`orch submit`, `orch status`, `orch cancel`: the submit stage."""

from __future__ import annotations

import argparse
import json
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
    if not a.wait:
        out.print(f"next: orch status {m.job_id}   then: orch collect {m.job_id}", markup=False)
        return 0
    return _wait_and_summarize(run, a.timeout)


def _wait_and_summarize(run: Path, timeout: float | None) -> int:
    from orchestrator.submit.core import wait

    last = {"state": None}

    def show(st: dict[str, Any]) -> None:
        found = sum(1 for v in st["reports"].values() if v)
        line = f"job {st['job_id']}: {st['state']} ({found}/{len(st['profiled_ranks'])} reports)"
        if line != last["state"]:
            err.print(line, markup=False)
            last["state"] = line

    st = wait(run, show, timeout_s=timeout)
    print_status(st)
    return 0 if st["state"] == "COMPLETED" else 1


def print_status(st: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from orchestrator.submit.backend import TERMINAL

    out.print(f"job {escape(st['job_id'])} ({escape(st['name'])}, {st['executor']}): [bold]{st['state']}[/bold] "
              f"(from {escape(st['source'])})")
    stop = st.get("stop")
    if stop:  # orch's node supervisor stopped it: say why and when
        why = {"timeout": "at the time limit's early warning", "cancelled": "on a cancel"}.get(stop.get("reason"), "")
        out.print(f"stopped by orch {why} ({stop.get('signal', '?')}) after {stop.get('after_s', '?')} s: "
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
    none = "no report (its task's log says why)" if st["state"] in TERMINAL else "no report yet"
    for rank in st["profiled_ranks"]:
        files = st["reports"].get(rank) or st["reports"].get(str(rank)) or []
        out.print(f"rank {rank}: " + (", ".join(Path(f).name for f in files) if files else none), markup=False)


def cmd_status(a: argparse.Namespace) -> int:
    from orchestrator.submit.core import job_status

    st = job_status(run_arg(a))
    if a.json:
        out.print_json(json.dumps(st, default=str))
    else:
        print_status(st)
    return 0


def cmd_cancel(a: argparse.Namespace) -> int:
    from orchestrator.submit.core import cancel

    m, killed = cancel(run_arg(a))
    out.print(f"job {m.job_id} cancelled: captures stopped, then its processes"
              + (f"; killed {len(killed)} that outlived the stop (pids {', '.join(killed)})" if killed else ""),
              markup=False)
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
