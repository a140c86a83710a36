"""How the job ended, for the report: the scheduler's state, the first rank to fail and how,
the hang evidence (Flight Recorder, stacks: what `orch collect` kept in the store, see
store/evidence.py) and where each rank stood when its capture ended (`rank_end`,
63_rank_end.sql).

A report of a job that did not complete must say so first: the timings of a hung or stopped
job describe ranks waiting for a rank that never came, and read like a slowdown otherwise.
For a stopped job whose ranks ended in different places, the ranks behind (an earlier step,
or an earlier phase of the same step) are the ones that never reached what the others waited
in: the others' long last phase is a symptom.
"""

from __future__ import annotations

import re
from typing import Any

from orchestrator.analyze import flight, oom, stacks
from orchestrator.analyze.model_outcome import Outcome, RankOutcome, StackClassOut
from orchestrator.metrics.engine import Views
from orchestrator.store.evidence import JobEvidence, LastCollective, TaskEnd
from orchestrator.submit.failure import first_words

_OOM = re.compile(r"OutOfMemoryError|CUDA out of memory|CUDA error: out of memory")
# torch's message begins so; the rest (what it asked and held) is quoted beside the events.
_CUT_OOM = "CUDA out of memory."
_WORDS = {"COMPLETED": "completed", "FAILED": "failed", "TIMEOUT": "timed out", "CANCELLED": "cancelled",
          "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed", "PREEMPTED": "cancelled", "DEADLINE": "timed out",
          "BOOT_FAIL": "failed", "RUNNING": "running", "PENDING": "running"}


def evidence(v: Views) -> JobEvidence | None:
    """What `orch collect` kept of the job's end in the store (meta key `job`): the store alone
    says it, wherever it was copied, and no scheduler is asked."""
    return JobEvidence.from_store(v.scalar("SELECT max(value) FROM meta WHERE key = 'job'"))


def behind(ends: list[dict[str, Any]]) -> tuple[list[int], str]:
    """The ranks furthest behind: those that never reached the step, or the phase of the step,
    every other rank got to. A rank between them and the furthest rank waited for them too: a
    rank that has not begun step 8 holds up the ranks in step 8 (waiting in its collective) as
    well as one whose CPU ran ahead into step 9."""
    if len(ends) < 2:
        return [], ""
    low = min(e["last_step"] for e in ends)
    if low < max(e["last_step"] for e in ends):
        return [e["rank"] for e in ends if e["last_step"] == low], f"step {low + 1}"
    offs = [e for e in ends if e["furthest_offset_ns"] is not None]
    if not offs:
        return [], ""
    least = min(e["furthest_offset_ns"] for e in offs)
    late = [e["rank"] for e in offs if e["furthest_offset_ns"] == least]
    if len(late) == len(offs):
        return [], ""
    nxt = min((e for e in offs if e["furthest_offset_ns"] > least), key=lambda e: e["furthest_offset_ns"])
    return late, f"{nxt['furthest']} of step {low}"


# A stop takes up to this long to reach the ranks (stack dumps, then the release): where the
# stop's own time is unknown, the least any rank stood still before its capture ended is taken
# as the stop's own latency when it is under this.
STOP_LATENCY_NS = 10 * 10**9


def running(ends: list[dict[str, Any]], late: list[int], stop_ns: int | None = None) -> str:
    """Why the ranks behind were still running when the stop came, or "" (a hang, or no trace to
    tell): each began a range less than 3 of its steps (or 0.5 s) before the stop. The stop is
    `stop_ns` on the store's clock when orch recorded it; else the moment the rank that moved last
    stood still, when that is within STOP_LATENCY_NS of its capture's end (a stop's dumps and
    release take that long, so every rank of a healthy loop stands still for a second or more)."""
    by = {e["rank"]: e for e in ends}
    known = [e for e in ends if e["still_ns"] is not None]
    if stop_ns is not None:
        latency = {e["rank"]: e["end_ns"] - stop_ns for e in known}
    else:
        least = min((e["still_ns"] for e in known), default=0)
        latency = {e["rank"]: least if least < STOP_LATENCY_NS else 0 for e in known}
    said = []
    for r in late:
        e = by.get(r)
        if not e or e["still_ns"] is None or not e["step_ns"]:
            return ""
        still = e["still_ns"] - max(latency.get(r, 0), 0)
        if still >= max(3 * e["step_ns"], 5 * 10**8):
            return ""
        said.append(f"rank {r} began its last range {max(still, 0) / 1e9:.2f} s before the stop, "
                    f"its steps take {e['step_ns'] / 1e9:.2f} s")
    return "; ".join(said[:4])


def never_exited(ends: list[dict[str, Any]], stop_ns: int | None = None) -> tuple[list[int], list[int]]:
    """The ranks that finished their loop and never exited, and those that exited after it: each
    closed its last range itself and made calls after it (`rank_end.ran_on_ns`); the first kept
    making them until the stop (to within STOP_LATENCY_NS of it, or of the last call any rank
    made where the stop's time is unknown), the second stopped well before. A rank of neither
    (no call after its loop) says nothing either way."""
    last = {e["rank"]: e["end_ns"] + e["ran_on_ns"] for e in ends if e.get("ran_on_ns") is not None}
    if not last:
        return [], []
    stop = stop_ns if stop_ns is not None else max(e["end_ns"] + (e.get("ran_on_ns") or 0) for e in ends)
    stuck = [r for r, t in last.items() if t >= stop - STOP_LATENCY_NS]
    return sorted(stuck), sorted(set(last) - set(stuck))


def clock_base(v: Views) -> int | None:
    """The UTC time of the store's clock zero (collect's `clock_base_utc_ns`): a UTC time the job
    recorded (a stop, a Flight Recorder entry) minus this is on the trace's clock."""
    base = v.scalar("SELECT max(CAST(value AS BIGINT)) FROM meta WHERE key = 'clock_base_utc_ns'")
    return None if base is None else int(base)


def stop_ns(ev: JobEvidence, base: int | None) -> int | None:
    """When orch's stop began, on the store's clock (None when not recorded)."""
    if ev.stop is None or ev.stop.at_utc_ns is None or base is None:
        return None
    return ev.stop.at_utc_ns - base


def call_step(v: Views, c: LastCollective, base: int | None) -> int | None:
    """The step in which the rank called the collective (its recorder's time, on the store's
    clock, within the rank's step ranges); None when the trace has no step there."""
    if c.created_utc_ns is None or base is None:
        return None
    t = c.created_utc_ns - base
    return v.scalar('SELECT max(step) FROM every_step WHERE rank = ? AND start <= ? AND "end" >= ?', [c.rank, t, t])


def first_failure(tasks: list[TaskEnd]) -> TaskEnd | None:
    """The job's first failure among its nodes' (tasks'): a node whose first failure only lost
    its peer comes after one whose did not, whatever the nodes' clocks say; then the earliest."""
    failed = sorted((t for t in tasks if t.failed_rank is not None),
                    key=lambda t: (t.failed_by_peer, t.failed_at or "~"))
    return failed[0] if failed else None


def build_outcome(v: Views) -> Outcome | None:
    """The outcome of the store's job (None for a store of reports orch did not submit)."""
    ev = evidence(v)
    if ev is None:
        return None
    sched = ev.state
    ends = v.rows("rank_end")
    exits = {t.failed_rank: t.failed_exit or None for t in ev.tasks if t.failed_rank is not None}
    ranks = [RankOutcome(rank=e["rank"], last_step=e["last_step"], last_done_step=e["last_done_step"],
                         open_ranges=list(e["open_ranges"] or []), furthest=e["furthest"], exit=exits.get(e["rank"]),
                         stack=ev.stacks.get(e["rank"], []),
                         ran_on_s=None if e["ran_on_ns"] is None else round(e["ran_on_ns"] / 1e9, 1),
                         **_exit_hang(ev, e["rank"]))
             for e in ends]
    # A rank whose report was lost still left its stack and its Flight Recorder: the root of a
    # hang can be one of them.
    seen = {e["rank"] for e in ends}
    ranks += [RankOutcome(rank=r, exit=exits.get(r), stack=ev.stacks.get(r, []))
              for r in sorted((set(ev.stacks) | {c.rank for c in ev.flight_recorder}) - seen)]
    state = _WORDS.get(sched, "unknown")
    stopped = sched in ("TIMEOUT", "CANCELLED", "DEADLINE")
    late, where = behind(ends) if stopped else ([], "")
    root_from = "trace" if late else None
    fr_late, fr_where, fr_lines = flight.mismatch(ev.flight_recorder)
    odd = flight.odd_ones(ev.flight_recorder)
    # Where the ranks' collectives first parted, that rank is the root: every later collective
    # of it is paired with another one, so who got furthest says nothing, and neither does which
    # rank's watchdog (or size check) fired first: the others only waited for it, or failed on it.
    split, split_lines = flight.diverged(ev.flight_diverged)
    if split:
        fr_late, odd, fr_lines = [], split, split_lines
    # The main-thread stacks: most ranks waiting at one point, the few elsewhere.
    sc = stacks.classes(ev.stack_classes)
    st_root = stacks.root(sc)
    parts = []
    ran_out = None
    failed: tuple[int | None, str, int | None] = (None, "", None)
    first = first_failure(ev.tasks)
    # A job that failed because a rank's collective timed out or lost its peer (NCCL's watchdog,
    # a closed connection) hung first: the rank to blame is the one the recorder shows never
    # entered the collective the others waited in (or called one the others did not), or the
    # one whose stack was elsewhere while the others waited, not the one whose watchdog fired first.
    blamed = fr_late or odd or st_root
    waited_out = bool(first and first.failed_by_peer and blamed and first.failed_rank not in blamed)
    if (stopped or waited_out) and fr_late and not late:
        # The trace did not tell the ranks apart (all in the same phase), the recorder does.
        late, where, root_from = fr_late, fr_where, "flight_recorder"
    # The rank that called the odd collective failed first by its own error (gloo's size check
    # aborts it): a failure of the root itself, told as such.
    root_failed = bool(first and first.failed_rank in split and not first.failed_by_peer)
    called_other = bool((stopped or waited_out or (split and not root_failed)) and sched != "COMPLETED" and odd
                        and (not late or split))
    if called_other:
        late, root_from = odd, "flight_recorder"
    crowd = next((c for c in sc if c.waits and not set(c.ranks) & set(st_root)), None)
    if (stopped or waited_out) and st_root and not late:
        # Neither the trace nor the recorder tells the ranks apart; their stacks do.
        late, root_from = st_root, "stacks"
    base = clock_base(v)
    # Every rank finished the same steps, and some never ended: what held the job to its limit
    # came after the loop (teardown, the interpreter's exit, code outside the ranges).
    stuck_after, exited = never_exited(ends, stop_ns(ev, base)) if stopped and not late else ([], [])
    if stuck_after:
        late, root_from = stuck_after, "trace"
    # A rank that called a collective the others did not is the root even where its loop went on
    # (NCCL can complete the mismatched pair and shift every later one): no running loop to judge.
    moving = "" if called_other else running(ends, late, stop_ns(ev, base))
    if moving:
        # A stop caught the ranks at different points of a running loop: a straggler, not a hang.
        parts.append(f"no rank hung: the stop found the ranks at different points of a running loop ({moving})")
        late, root_from = [], None
    frame = _root_frame(ev, sc, late, called_other)
    if late:
        state = "hung"
        known = {e["rank"] for e in ends} | {r.rank for r in ev.flight_recorder} | {r for c in sc for r in c.ranks}
        waiting = sorted(known - set(late))
        step = next((call_step(v, c, base) for c in ev.flight_diverged if c.rank in late), None) if called_other \
            else None
        if stuck_after:
            by = {e["rank"]: e for e in ends}
            said = (f"rank(s) {_list(late)} finished every step (the last, {by[late[0]]['last_step']}) but never "
                    f"exited: its process went on {by[late[0]]['ran_on_ns'] / 1e9:.1f} s past its last range, until "
                    "the stop (a hang after the training loop: in teardown, at the interpreter's exit, or in code "
                    "outside the ranges)" + (f", while rank(s) {_list(exited)} exited" if exited else ""))
            waiting = []
        elif called_other:
            said = (f"rank(s) {_list(late)} called a collective the others never called"
                    + (f" in step {step}" if step is not None else "") + " (the Flight Recorder line below)")
        elif root_from == "stacks" and crowd is not None:
            said = (f"rank(s) {_list(late)} never reached the point where the others waited (their main "
                    f"threads' stacks when orch stopped them): rank(s) {_list(late)} at {frame}, while rank(s) "
                    f"{stacks.ranges(crowd.ranks)} waited in {crowd.waits} at {crowd.frame}")
            waiting = []
        else:
            said = f"rank(s) {_list(late)} never reached {where}"
        parts.append(said + (f", where rank(s) {_list(waiting)} waited" if waiting else ""))
        parts += [f"rank {r.rank} was in {' > '.join(r.open_ranges)}" for r in ranks
                  if r.rank in late and r.open_ranges]
    if first is not None and first.failed_rank is not None and sched != "COMPLETED":
        head = first_words(first.failed_rank, first.failed_exit or "")
        # The launcher's line adds the rank's own last words (its exception, a native abort's message).
        said = first.error if first.error.startswith(head) else head
        oom_said = ev.oom.get(first.failed_rank)
        if _OOM.search(first.error) and oom_said and _CUT_OOM in said:
            # torch's whole message is quoted with the memory below, not cut short here.
            said = said[: said.index(_CUT_OOM) + len(_CUT_OOM) - 1]
        if late and first.failed_rank not in late and (waited_out or called_other):
            how = "waiting for them" if first.failed_by_peer else "on their collective"
            parts.append(f"rank {first.failed_rank} failed first, {how} (a victim): {said}")
        else:
            # Where its capture ends, not which step it finished: a SIGKILLed program loses the
            # ranges it was in, so its report ends with the step before the one it died in.
            ro = next((r for r in ranks if r.rank == first.failed_rank), None)
            failed = (first.failed_rank, said, ro.last_step if ro else None)
            odd_call = next((c.frame for c in ev.flight_diverged if c.rank == first.failed_rank and c.frame), "")
            if not late and root_failed and odd_call:  # the collective it called that the others did not
                frame, root_from = odd_call, "flight_recorder"
            elif not late and first.failed_frames:  # where it raised: the line to fix
                frame, root_from = stacks.program_frame(first.failed_frames), "traceback"
            step = f"; its capture ends in step {ro.last_step}" if ro and ro.last_step is not None else ""
            parts.append(f"{said}{step}")
        if _OOM.search(first.error):
            ran_out = first.failed_rank
            parts.append(oom.at_failure(v, first.failed_rank, oom_said))
    ended = [r for r in ranks if r.exit_grace_s is not None]
    for grace in sorted({r.exit_grace_s for r in ended}):
        parts.append(f"rank(s) {_list([r.rank for r in ended if r.exit_grace_s == grace])} finished but did not "
                     f"exit: orch ended it {grace} s later (profile.exit_grace_s)")
    why_lost: dict[str, list[int]] = {}
    for r, why in sorted(ev.reports_lost.items()):
        why_lost.setdefault(why, []).append(r)
    parts += [f"no report from rank(s) {_list(rs)}: {why} (the task's log says more)" for why, rs in why_lost.items()]
    lost = [r["rank"] for r in v.rows("gpu_lost")]
    if lost:
        parts.append(f"GPU trace lost on rank(s) {_list(lost)}: its capture ended before CUPTI handed over "
                     "its kernels (a process killed, or stopped while a kernel ran); its CPU side is kept")
    if ev.stop is not None:
        why = {"timeout": "the time limit's early warning", "cancelled": "a cancel",
               "step_ended": "Slurm's end of the step (another node failed)"}.get(ev.stop.reason or "", "a stop")
        after = "?" if ev.stop.after_s is None else ev.stop.after_s
        parts.append(f"orch stopped the captures at {why} after {after} s")
    line = f"{state} ({sched})" + (": " + "; ".join(parts) if parts else "")
    return Outcome(state=state, scheduler_state=sched, line=line, behind=late, never_exited=stuck_after, ranks=ranks,
                   dumps=ev.dumps, flight_recorder=fr_lines, ran_out=ran_out, gpu_lost=lost,
                   failed_first=failed[0], failed_how=failed[1], failed_step=failed[2],
                   root_frame=frame or None, root_from=root_from if frame or late else None,
                   stack_classes=stacks.mark(sc, late),
                   torch_oom=ev.oom.get(ran_out) if ran_out is not None else None)


def _exit_hang(ev: JobEvidence, rank: int) -> dict[str, Any]:
    """A rank's program that finished and whose process orch ended: the grace it had, and where
    each thread of the program's own that still ran was."""
    h = ev.exit_hangs.get(rank)
    if h is None:
        return {}
    return {"exit_grace_s": h.grace_s, "exit_threads": [stacks.program_frame(t) for t in h.threads]}


def _root_frame(ev: JobEvidence, sc: list[StackClassOut], late: list[int], called_other: bool) -> str:
    """Where the root's code was: the collective it called that the others did not (the
    recorder's frame), else its main thread's innermost frame of the program's own code; ""
    where neither is known."""
    if not late:
        return ""
    if called_other:
        rows = ev.flight_diverged or ev.flight_recorder
        c = next((c for c in rows if c.rank in late and c.frame), None)
        if c is not None:
            return c.frame
    cls = next((c for c in sc if late[0] in c.ranks), None)
    return cls.frame if cls is not None else ""


def _list(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))
