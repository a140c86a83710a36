"""How the job ended, for the report: the scheduler's state, the first rank to fail and how,
the hang evidence (Flight Recorder, stacks: what `orch collect` kept in the store, see
collect/evidence.py) and where each rank stood when its capture ended (`rank_end`,
63_rank_end.sql).

A report of a job that did not complete must say so first: the timings of a hung or stopped
job describe ranks waiting for a rank that never came, and read like a slowdown otherwise.
For a stopped job whose ranks ended in different places, the ranks behind (an earlier step,
or an earlier phase of the same step) are the ones that never reached what the others waited
in: the others' long last phase is a symptom.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from orchestrator.analyze import flight
from orchestrator.analyze.engine import Views
from orchestrator.analyze.model import Outcome, RankOutcome
from orchestrator.collect.evidence import gather
from orchestrator.submit.failure import first_words

_OOM = re.compile(r"OutOfMemoryError|CUDA out of memory|CUDA error: out of memory")
_WORDS = {"COMPLETED": "completed", "FAILED": "failed", "TIMEOUT": "timed out", "CANCELLED": "cancelled",
          "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed", "PREEMPTED": "cancelled", "DEADLINE": "timed out",
          "BOOT_FAIL": "failed", "RUNNING": "running", "PENDING": "running"}


def evidence(v: Views, store: Path | str) -> dict[str, Any]:
    """What `orch collect` kept of the job's end in the store (meta key `job`), else what the run
    directory beside the store holds now (a store collected before evidence was kept)."""
    kept = v.scalar("SELECT max(value) FROM meta WHERE key = 'job'")
    if kept:
        try:
            return json.loads(kept)
        except ValueError:
            pass
    return gather(Path(store).parent)


def behind(ends: list[dict[str, Any]]) -> tuple[list[int], str]:
    """Ranks that never reached the step, or the phase of the step, the others were in."""
    if len(ends) < 2:
        return [], ""
    top = max(e["last_step"] for e in ends)
    late = [e["rank"] for e in ends if e["last_step"] < top]
    if late:
        return late, f"step {top}"
    offs = [e for e in ends if e["furthest_offset_ns"] is not None]
    if not offs:
        return [], ""
    far = max(offs, key=lambda e: e["furthest_offset_ns"])
    late = [e["rank"] for e in offs if e["furthest_offset_ns"] < far["furthest_offset_ns"]]
    return late, f"{far['furthest']} of step {top}"


def running(ends: list[dict[str, Any]], late: list[int]) -> str:
    """Why the ranks behind were still running when their captures ended, or "" (a hang, or no
    trace to tell): each began a range less than 3 of its steps (or 0.5 s) before its end."""
    by = {e["rank"]: e for e in ends}
    said = []
    for r in late:
        e = by.get(r)
        if not e or e["still_ns"] is None or not e["step_ns"] or e["still_ns"] >= max(3 * e["step_ns"], 5 * 10**8):
            return ""
        said.append(f"rank {r} began its last range {e['still_ns'] / 1e9:.2f} s before its capture ended, "
                    f"its steps take {e['step_ns'] / 1e9:.2f} s")
    return "; ".join(said[:4])


def first_failure(tasks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The job's first failure among its nodes' (tasks'): a node whose first failure only lost
    its peer comes after one whose did not, whatever the nodes' clocks say; then the earliest."""
    failed = sorted((t for t in tasks if "failed_rank" in t),
                    key=lambda t: (bool(t.get("failed_by_peer")), t.get("failed_at") or "~"))
    return next(({"rank": t["failed_rank"], "how": t["failed_exit"], "said": t.get("error") or "",
                  "by_peer": bool(t.get("failed_by_peer"))} for t in failed), None)


def build_outcome(v: Views, store: Path | str) -> Outcome | None:
    """The outcome of the run whose store is `store` (None for a store outside a run directory)."""
    ev = evidence(v, store)
    st = ev.get("status")
    if not st:
        return None
    sched = st["state"]
    ends = v.rows("rank_end")
    exits = {t["failed_rank"]: t["failed_exit"] or None for t in st["tasks"] if "failed_rank" in t}
    ranks = [RankOutcome(rank=e["rank"], last_step=e["last_step"], last_done_step=e["last_done_step"],
                         open_ranges=list(e["open_ranges"] or []), furthest=e["furthest"], exit=exits.get(e["rank"]),
                         stack=ev.get("stacks", {}).get(str(e["rank"]), []))
             for e in ends]
    state = _WORDS.get(sched, "unknown")
    stopped = sched in ("TIMEOUT", "CANCELLED", "DEADLINE")
    late, where = behind(ends) if stopped else ([], "")
    fr_late, fr_where, fr_lines = flight.mismatch(ev.get("flight_recorder", []))
    parts = []
    first = first_failure(st["tasks"])
    # A job that failed because a rank's collective timed out or lost its peer (NCCL's watchdog,
    # a closed connection) hung first: the rank to blame is the one the recorder shows never
    # entered the collective the others waited in, not the one whose watchdog fired first.
    waited_out = bool(first and first["by_peer"] and fr_late and first["rank"] not in fr_late)
    if (stopped or waited_out) and fr_late and not late:
        # The trace did not tell the ranks apart (all in the same phase), the recorder does.
        late, where = fr_late, fr_where
    moving = running(ends, late)
    if moving:
        # A stop caught the ranks at different points of a running loop: a straggler, not a hang.
        parts.append(f"no rank hung: the stop found the ranks at different points of a running loop ({moving})")
        late = []
    if late:
        state = "hung"
        known = {e["rank"] for e in ends} | {r["rank"] for r in ev.get("flight_recorder", [])}
        waiting = sorted(known - set(late))
        parts.append(f"rank(s) {_list(late)} never reached {where}"
                     + (f", where rank(s) {_list(waiting)} waited" if waiting else ""))
        parts += [f"rank {r.rank} was in {' > '.join(r.open_ranges)}" for r in ranks
                  if r.rank in late and r.open_ranges]
    if first and sched != "COMPLETED" and waited_out and late:
        parts.append(f"rank {first['rank']} failed first, waiting for them (a victim): "
                     f"{first['said'] or first_words(first['rank'], first['how'])}")
    elif first and sched != "COMPLETED":
        # Where its capture ends, not which step it finished: a SIGKILLed program loses the
        # ranges it was in, so its report ends with the step before the one it died in.
        ro = next((r for r in ranks if r.rank == first["rank"]), None)
        step = f"; its capture ends in step {ro.last_step}" if ro and ro.last_step is not None else ""
        head = first_words(first["rank"], first["how"])
        # The launcher's line adds the rank's own last words (its exception, a native abort's message).
        said = first["said"] if first["said"].startswith(head) else head
        parts.append(f"{said}{step}")
    if first and _OOM.search(first["said"]):
        parts.append(_memory_at_failure(v, first["rank"]))
    lost = [r["rank"] for r in v.rows("gpu_lost")]
    if lost:
        parts.append(f"GPU trace lost on rank(s) {_list(lost)}: its capture ended before CUPTI handed over "
                     "its kernels (a process killed, or stopped while a kernel ran); its CPU side is kept")
    stop = st.get("stop") or {}
    if stop:
        why = {"timeout": "the time limit's early warning", "cancelled": "a cancel",
               "step_ended": "Slurm's end of the step (another node failed)"}.get(stop.get("reason"), "a stop")
        parts.append(f"orch stopped the captures at {why} after {stop.get('after_s', '?')} s")
    line = f"{state} ({sched})" + (": " + "; ".join(parts) if parts else "")
    return Outcome(state=state, scheduler_state=sched, line=line, behind=late, ranks=ranks,
                   dumps=ev.get("dumps", []), flight_recorder=fr_lines, gpu_lost=lost)


def _memory_at_failure(v: Views, rank: int) -> str:
    """How much GPU memory the rank that ran out held at its highest, in which step, and what
    the other ranks held at that moment (mem_peak, on the rank's own GPU)."""
    peak = v.by_rank("mem_peak").get(rank)
    if peak is None:
        return f"rank {rank}'s GPU memory was not traced (profile.cuda_memory_usage: true records it)"
    cap = v.by_rank("mem_rank").get(rank, {}).get("capacity")
    others = ", ".join(f"rank {o['rank']} {o['bytes'] / 2**30:.2f} GiB" for o in peak["others"][:8])
    return (f"rank {rank} held {peak['peak_bytes'] / 2**30:.2f} GiB"
            + (f" of its GPU's {cap / 2**30:.1f} GiB" if cap else "")
            + (f" at its highest, in step {peak['step']}" if peak["step"] is not None else " at its highest")
            + (f"; the others then: {others}" if others else ""))


def _list(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))
