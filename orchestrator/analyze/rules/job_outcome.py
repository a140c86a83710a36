"""The job did not complete (it failed, hung, timed out or was cancelled): that comes first.

A stopped job's timings describe ranks waiting for a rank that never came; without this
finding the report reads as a slowdown of the waiting ranks. The finding names the ranks
that never reached what the others waited in (a hang), or the first rank to fail and how,
and each rank's last finished step and the ranges it was in when the job ended.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model_outcome import Outcome
from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding
from orchestrator.analyze.stacks import line as stack_line

_FIX = {
    "hung": "Look at what the ranks behind were doing (their open ranges above, the stack dumps and Flight Recorder "
            "files in the run's dumps/ folder): the other ranks only waited for them.",
    "failed": "Read the failing rank's traceback (`orch status <job>`); the other ranks were stopped after it.",
    "timed out": "The job was still running at its time limit: raise slurm.time or profile fewer steps "
                 "(profile.capture_range).",
    "cancelled": "The job was cancelled: the steps it finished are analysed, the unfinished one is not.",
    # The ranks closed their last range themselves and kept running: nothing in the loop held them.
    "after": "Rank(s) {ranks} finished the training loop, and what ran after it never returned: it held the job "
             "to its end. Their stacks when orch stopped them are in the run's dumps/ folder (a file left empty: "
             "no Python thread of it could run then, as when the interpreter is exiting). Look for a collective "
             "or barrier after the loop that some ranks never call (evaluation, a checkpoint or a log line on some "
             "ranks only), a thread or process the program started and never ended, and end torch.distributed "
             "explicitly (dist.barrier(), then dist.destroy_process_group()) at the end of main. Once its program "
             "has finished, orch ends such a rank after profile.exit_grace_s instead of waiting for the time "
             "limit. Every step above is complete: its analysis stands.",
    "oom": "Rank {rank} ran out of GPU memory (how much it held, in which step, and what the others held then: "
           "above; its growth per step: the memory findings). Lower that rank's peak: the batch or sample that "
           "step got (a long sequence, an unbucketed batch), what the loop keeps from step to step, a smaller "
           "micro-batch with gradient accumulation, activation checkpointing.",
    # What orch ended once the program had finished: a thread it started and never ended, which
    # the interpreter waits for before it exits, or a teardown that hung.
    "threads": "End the threads the program starts once the loop is done, then join them (put a sentinel on the "
               "queue a thread reads, or set an Event it checks), or start them with daemon=True: the interpreter "
               "waits for every other thread before it exits. Every thread's stack is in dumps/stacks.r{rank}.txt.",
    "teardown": "No thread of the program's own still ran: the interpreter's or a library's teardown hung (its "
                "stacks are in dumps/stacks.r{rank}.txt). End torch.distributed explicitly at the end of main "
                "(dist.barrier(), then dist.destroy_process_group()).",
    # A collective some ranks call and others do not (inside `if rank == 0:`, an evaluation or
    # a log line on the main process only) pairs with a different collective on the others: NCCL
    # hangs, gloo aborts on the size check.
    "mismatch": "The ranks called different collectives at the same point: every rank must call the same "
                "collectives in the same order. Look at the stack of the rank named above for a collective "
                "called on some ranks only (under `if rank == 0:`, in evaluation, logging or checkpointing) "
                "and call it on every rank, or use a value that needs no collective.",
}


@dataclass
class JobOutcome(Rule):
    kind = "job_outcome"
    leads = True
    reads = ()

    def evaluate(self, ctx: Context) -> list[Finding]:
        o = ctx.report.outcome
        if o is not None and o.state == "completed":
            return _not_exited(o)
        if o is None or o.state in ("running", "unknown"):
            return []
        evidence = [o.line] + [
            f"rank {r.rank}: last finished step {r.last_done_step if r.last_done_step is not None else 'none'}"
            + (f", in {' > '.join(r.open_ranges)} when its capture ended" if r.open_ranges else "")
            + (f", then went on {r.ran_on_s:.1f} s outside its ranges" if r.ran_on_s is not None else "")
            + (f", {r.exit}" if r.exit else "")
            for r in o.ranks] + list(o.flight_recorder)
        # The first rank to fail by its own error, not every rank that exited: on several nodes the
        # other nodes' ranks exit too, on the peer they lost.
        first = [o.failed_first] if o.failed_first is not None else []
        ranks = o.behind or first or [r.rank for r in o.ranks if r.exit] or [r.rank for r in o.ranks]
        evidence += [f"rank {r.rank} stack when it ended: {' <- '.join(r.stack)}" for r in o.ranks
                     if r.stack and r.rank in ranks][:4]
        if said := stack_line(o.stack_classes):
            evidence.append(said)
        evidence += [f"hang evidence: {d}" for d in o.dumps][:8]
        mismatch = "collective mismatch" in o.line or any("differs across ranks" in x for x in o.flight_recorder)
        who = ", ".join(map(str, o.behind))
        oom = o.ran_out
        after = bool(o.never_exited)
        title = f"the job {'was cancelled' if o.state == 'cancelled' else o.state} ({o.scheduler_state})" + (
            f": rank(s) {who} called a collective the others did not" if o.behind and mismatch else
            f": rank(s) {who} finished every step but never exited" if after else
            f": rank(s) {who} never got as far as the others" if o.behind else
            f": rank {oom} ran out of GPU memory" if oom is not None else
            f": {_short(o.failed_how)}" if o.failed_first is not None else "")
        fix = _mismatch_fix(o) if mismatch else _FIX["after"].format(ranks=who) if after else \
            _root_fix(o) if o.state == "hung" and o.behind else \
            _oom_fix(o, oom) if oom is not None else \
            _failed_fix(o) if o.failed_first is not None else _FIX.get(o.state, _FIX["failed"])
        # A hang's victims: every other rank, the one whose watchdog fired first included; a
        # failure's: every other rank, stopped after the first (or failing on the peer it lost).
        victims = [r.rank for r in o.ranks if r.rank not in ranks] if (o.behind and not after) or first else []
        return [finding(self.kind, ranks, title, evidence, fix, 0.0, severity="high", victims=victims)]


def _not_exited(o: Outcome) -> list[Finding]:
    """A job that completed because orch ended the ranks whose program finished and whose process
    did not: without orch it would have held its allocation until its time limit."""
    ended = [r for r in o.ranks if r.exit_grace_s is not None]
    if not ended:
        return []
    who = [r.rank for r in ended]
    evidence = [o.line] + [f"rank {r.rank}: " + (f"a thread of the program's own still ran at "
                                                 f"{', '.join(r.exit_threads)}" if r.exit_threads
                                                 else "no thread of the program's own still ran") for r in ended]
    threads = any(r.exit_threads for r in ended)
    title = (f"rank(s) {', '.join(map(str, who))} finished but did not exit: orch ended it after "
             f"{ended[0].exit_grace_s} s (profile.exit_grace_s)")
    return [finding("job_outcome", who, title, evidence, _FIX["threads" if threads else "teardown"].format(
        rank=who[0]), 0.0, severity="medium")]


def _short(text: str, most: int = 160) -> str:
    """A title's share of a long error line."""
    return text if len(text) <= most else text[: most - 1].rstrip() + "…"


def _oom_fix(o: Outcome, rank: int) -> str:
    """Out of memory: the rank, where its program asked for the allocation that failed, and what to lower."""
    at = f" It asked for the allocation that failed at {o.root_frame}." if o.root_frame else ""
    fix = _FIX["oom"].format(rank=rank)
    head, _, rest = fix.partition(". ")
    return f"{head}.{at} {rest}"


def _failed_fix(o: Outcome) -> str:
    """The first rank to fail by its own error: where its capture ends and what to read."""
    step = f" (its capture ends in step {o.failed_step})" if o.failed_step is not None else ""
    at = f" (raised at {o.root_frame}, the innermost line of the program's own code)" if o.root_frame else ""
    return (f"Rank {o.failed_first} failed first{step}: its error is above{at}, its whole traceback in `orch status "
            "<job>` and the task's log. Fix that error; the other ranks were stopped after it.")


def _mismatch_fix(o: Outcome) -> str:
    """A collective some ranks called and others did not: the call to fix, where the recorder
    says the root called it."""
    ranks = o.behind or ([o.failed_first] if o.failed_first is not None and o.root_from == "flight_recorder" else [])
    where = f" at {o.root_frame}" if o.root_frame else ""
    who = f"Rank(s) {', '.join(map(str, ranks))} called a collective the others did not{where}: fix that call. " \
        if ranks else ""
    return who + _FIX["mismatch"]


def _root_fix(o: Outcome) -> str:
    """The hang's fix names its root (the first rank behind), what it was doing and the line of
    its own code it was at."""
    root = next((r for r in o.ranks if r.rank == o.behind[0]), None)
    doing = []
    if root is not None and root.open_ranges:
        doing.append(f"it was in {' > '.join(root.open_ranges)}")
    if root is not None and root.stack:
        loader = any("dataloader" in f for f in root.stack)
        doing.append(("its main thread waited for its DataLoader, " if loader else "its main thread was at ")
                     + " <- ".join(root.stack[:3]))
    there = f"at {o.root_frame}" if o.root_frame else "there"
    return (f"Rank {o.behind[0]} is the root" + (f" ({'; '.join(doing)})" if doing else "")
            + f": fix what its code does {there} (a data loader or file read that blocks, a sleep or wait for "
              "something that never comes, a collective or barrier called on some ranks only, a rank-dependent "
              "branch); the other ranks only waited for it. Its stack dumps and Flight Recorder are in the run's "
              "dumps/ folder.")


RULE = JobOutcome()
