"""ONE Slurm job array through submitit's `map_array` (`orch collect --on-cluster` maps its
reports with it): a function over chunks of items, each chunk one array task on a compute
node, with a cluster config (partition, account, qos, time, module loads / setup lines).
It lives in submit/ beside the job submitter: one place knows Slurm and submitit, collect
only says what to run on which items. The submitting process only polls: one
`sacct` (else `squeue`) call per poll for the whole array plus submitit's result files,
shown as a rich progress bar. Tasks that end FAILED, TIMEOUT, PREEMPTED, NODE_FAIL,
OUT_OF_MEMORY, CANCELLED, or that vanish without a result, are returned with the tail of
their submitit log, so the caller can list them and mark their items.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import submitit
from rich.console import Console

from orchestrator import progress
from orchestrator.errors import OrchError
from orchestrator.spec.model import ClusterConfig
from orchestrator.submit.backend import TERMINAL, tail
from orchestrator.submit.slurm import normalize_state, run_command, slurm_minutes

T = TypeVar("T")

MAX_TASKS = 1000  # Slurm's default MaxArraySize is 1001


@dataclass
class ArrayOptions:
    """How to shape the array: per-task time, CPUs and items, and how many run at once.
    `cluster` None: the submitted job's own cluster config (the caller fills it in)."""

    cluster: ClusterConfig | None = None
    time: str | None = None  # Slurm time per task; default the cluster config's
    cpus: int | None = None  # per task; default the cluster config's cpus_per_task, else 1
    chunk: int | None = None  # items per task; default so that the array has <= MAX_TASKS tasks
    parallelism: int = 256
    poll_s: float = 2.0
    timeout_s: float | None = None


@dataclass
class TaskOutcome:
    """One array task's end; `reports`: what its items name (the caller's `label` of each)."""

    task: int
    job_id: str
    state: str
    reports: list[Path]
    node: str | None = None
    log_tail: str = ""
    error: str = ""
    hosts: list[str] = field(default_factory=list)


def chunks(tasks: list[T], size: int | None) -> list[list[T]]:
    """`size` items per task; by default as few per task as keep the array within MAX_TASKS."""
    size = size or max(1, -(-len(tasks) // MAX_TASKS))
    return [tasks[i: i + size] for i in range(0, len(tasks), size)]


def make_executor(opts: ArrayOptions, folder: Path, ntasks: int) -> submitit.SlurmExecutor:
    """submitit's Slurm executor shaped by `opts` (one node, one task per array element)."""
    c = opts.cluster
    if c is None:
        raise OrchError("--on-cluster needs a cluster config: pass --cluster NAME")
    if c.executor != "slurm":
        raise OrchError(f"--on-cluster needs a Slurm cluster config; {c.name!r} uses executor {c.executor!r} "
                        "(drop --on-cluster to map in a local process pool)")
    s = c.slurm
    ex = submitit.SlurmExecutor(folder=folder, max_num_timeout=0)
    params: dict[str, object] = {
        "job_name": "orch-collect", "nodes": 1, "ntasks_per_node": 1,
        "time": slurm_minutes(opts.time or s.time), "cpus_per_task": opts.cpus or s.cpus_per_task or 1,
        "array_parallelism": max(1, min(opts.parallelism, ntasks)), "signal_delay_s": 30,
    }
    for key in ("partition", "account", "qos", "constraint", "mem"):
        value = getattr(s, key)
        if value:
            params[key] = value
    setup = list(s.setup or []) + [f"module load {m}" for m in (s.modules or [])]
    if setup:
        params["setup"] = setup
    ex.update_parameters(**params)
    return ex


def _states(array_id: str, ntasks: int) -> dict[int, tuple[str, str | None]]:
    """task -> (state, node) from one sacct call; squeue when accounting is off."""
    out: dict[int, tuple[str, str | None]] = {}
    p = run_command(["sacct", "-j", array_id, "-X", "-n", "-P", "-o", "JobID,State,NodeList"])
    rows = p.stdout.splitlines() if p is not None and p.returncode == 0 else []
    if not rows:
        q = run_command(["squeue", "-h", "-r", "-j", array_id, "-o", "%i|%T|%N"])
        rows = q.stdout.splitlines() if q is not None and q.returncode == 0 else []
    for row in rows:
        jid, _, rest = row.partition("|")
        state, _, node = rest.partition("|")
        _, _, idx = jid.partition("_")
        if idx.isdigit() and int(idx) < ntasks:
            out[int(idx)] = (normalize_state(state), node or None)
    return out


def _result(job: submitit.Job) -> tuple[str, str] | None:
    """('success'|'error', text) from submitit's result pickle, None while absent."""
    try:
        with open(job.paths.result_pickle, "rb") as fh:
            outcome, value = pickle.load(fh)
    except FileNotFoundError:
        return None
    except Exception as e:  # half-written: read again at the next poll
        return ("pending", type(e).__name__)
    if outcome == "success":
        return ("success", "")
    text = str(value).strip().splitlines()
    return ("error", text[-1][:300] if text else "")


def run_array(fn: Callable[[list[T]], Any], tasks: list[T], folder: Path, opts: ArrayOptions, console: Console,
              label: Callable[[T], Path]) -> list[TaskOutcome]:
    """Submit `fn` over chunks of `tasks` as one array, show progress until every task is over,
    return every task's outcome. `fn` raises when its chunk failed: Slurm then records FAILED."""
    groups = chunks(tasks, opts.chunk)
    ex = make_executor(opts, folder, len(groups))
    try:
        jobs = ex.map_array(fn, groups)
    except Exception as e:  # submitit.FailedJobError, CalledProcessError, OSError
        lines = [ln.strip().removeprefix("sbatch: error:").strip() for ln in str(e).splitlines() if ln.strip()]
        raise OrchError(f"sbatch rejected the collect array: {'; '.join(lines[-2:]) or 'no message'}") from None
    array_id = jobs[0].job_id.partition("_")[0]
    console.print(f"map: {len(tasks)} report(s) in {len(groups)} array task(s), job {array_id}", markup=False)
    outcomes = [TaskOutcome(task=i, job_id=j.job_id, state="PENDING", reports=[label(t) for t in g])
                for i, (j, g) in enumerate(zip(jobs, groups, strict=True))]
    done: set[int] = set()
    over_since: dict[int, float] = {}
    t0 = time.monotonic()
    with progress.task("map tasks", total=len(groups)) as bar:
        while len(done) < len(groups):
            states = _states(array_id, len(groups))
            for o, job in zip(outcomes, jobs, strict=True):
                if o.task in done:
                    continue
                state, node = states.get(o.task, (o.state, o.node))
                o.state, o.node = state, node or o.node
                res = _result(job)
                if res is not None and res[0] in ("success", "error"):
                    failed_as = state if state in TERMINAL and state != "COMPLETED" else "FAILED"
                    o.state, o.error = ("COMPLETED" if res[0] == "success" else failed_as), res[1]
                    done.add(o.task)
                elif state in TERMINAL:
                    # Over without a result: killed (time limit, memory, node, cancel, preempted
                    # and not requeued). A COMPLETED state may precede its pickle by a moment.
                    first = over_since.setdefault(o.task, time.monotonic())
                    if state != "COMPLETED" or time.monotonic() - first > 30:
                        o.state = state if state != "COMPLETED" else "LOST"
                        o.error = o.error or f"no result ({state})"
                        done.add(o.task)
            counts: dict[str, int] = {}
            for o in outcomes:
                counts[o.state] = counts.get(o.state, 0) + 1
            bar.update(completed=len(done),
                       description="map tasks " + ", ".join(f"{k.lower()} {v}" for k, v in sorted(counts.items())))
            if len(done) == len(groups):
                break
            if opts.timeout_s is not None and time.monotonic() - t0 > opts.timeout_s:
                for o in outcomes:
                    if o.task not in done:
                        o.error = f"still {o.state} after {opts.timeout_s:.0f}s (orch stopped waiting)"
                break
            time.sleep(opts.poll_s)
    final = _states(array_id, len(groups))  # nodes of tasks that ended between two polls
    for o, job in zip(outcomes, jobs, strict=True):
        o.node = o.node or final.get(o.task, ("", None))[1]
        if o.state != "COMPLETED":
            o.log_tail = tail(Path(job.paths.stderr)) or tail(Path(job.paths.stdout))
    return outcomes
