"""How the job ended, for the report: the scheduler's state (through `orch status`'s own code),
the first rank to fail and how, and where each rank stood when its capture ended
(`rank_end`, 63_rank_end.sql).

A report of a job that did not complete must say so first: the timings of a hung or stopped
job describe ranks waiting for a rank that never came, and read like a slowdown otherwise.
For a stopped job whose ranks ended in different places, the ranks behind (an earlier step,
or an earlier phase of the same step) are the ones that never reached what the others waited
in: the others' long last phase is a symptom.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.analyze.engine import Views
from orchestrator.analyze.model import Outcome, RankOutcome
from orchestrator.errors import OrchError

_WORDS = {"COMPLETED": "completed", "FAILED": "failed", "TIMEOUT": "timed out", "CANCELLED": "cancelled",
          "NODE_FAIL": "failed", "OUT_OF_MEMORY": "failed", "PREEMPTED": "cancelled", "DEADLINE": "timed out",
          "BOOT_FAIL": "failed", "RUNNING": "running", "PENDING": "running"}


def job_state(run: Path) -> dict[str, Any] | None:
    """`orch status` of the run `run`, or None when it is not an orch run directory."""
    if not (run / "manifest.json").is_file():
        return None
    from orchestrator.submit.core import job_status

    try:
        return job_status(run)
    except (OrchError, OSError):
        return None


def dumps(run: Path) -> list[str]:
    """The hang evidence `orch collect` gathered beside the reports."""
    d = run / "dumps"
    return sorted(str(p) for p in d.rglob("*") if p.is_file() and p.stat().st_size) if d.is_dir() else []


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


def build_outcome(v: Views, store: Path | str) -> Outcome | None:
    """The outcome of the run whose store is `store` (None for a store outside a run directory)."""
    st = job_state(Path(store).parent)
    if st is None:
        return None
    sched = st["state"]
    ends = v.rows("rank_end")
    exits = {t["failed_rank"]: t["failed_exit"] for t in st["tasks"] if "failed_rank" in t}
    ranks = [RankOutcome(rank=e["rank"], last_step=e["last_step"], last_done_step=e["last_done_step"],
                         open_ranges=list(e["open_ranges"] or []), furthest=e["furthest"], exit=exits.get(e["rank"]))
             for e in ends]
    state = _WORDS.get(sched, "unknown")
    late, where = behind(ends) if sched in ("TIMEOUT", "CANCELLED", "DEADLINE") else ([], "")
    parts = []
    if late:
        state = "hung"
        waiting = [e["rank"] for e in ends if e["rank"] not in late]
        parts.append(f"rank(s) {_list(late)} never reached {where}, where rank(s) {_list(waiting)} waited")
        parts += [f"rank {r.rank} was in {' > '.join(r.open_ranges)}" for r in ranks
                  if r.rank in late and r.open_ranges]
    first = next(({"rank": t["failed_rank"], "how": t["failed_exit"]} for t in st["tasks"] if "failed_rank" in t),
                 None)
    if first and sched != "COMPLETED":
        # Where its capture ends, not which step it finished: a SIGKILLed program loses the
        # ranges it was in, so its report ends with the step before the one it died in.
        ro = next((r for r in ranks if r.rank == first["rank"]), None)
        step = f"; its capture ends in step {ro.last_step}" if ro and ro.last_step is not None else ""
        parts.append(f"rank {first['rank']} failed first ({first['how']}){step}")
    stop = st.get("stop") or {}
    if stop:
        why = {"timeout": "the time limit's early warning", "cancelled": "a cancel"}.get(stop.get("reason"), "a stop")
        parts.append(f"orch stopped the captures at {why} after {stop.get('after_s', '?')} s")
    line = f"{state} ({sched})" + (": " + "; ".join(parts) if parts else "")
    return Outcome(state=state, scheduler_state=sched, line=line, behind=late, ranks=ranks,
                   dumps=dumps(store.parent))


def _list(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))
