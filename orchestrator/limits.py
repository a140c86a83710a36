"""A job's time limit and its stop timing, shared by the rendered scripts and the executors.

The order in which a job that does not end by itself is stopped (time limit, cancel):
  1. the early warning (SIGUSR2), `lead` seconds before the limit: Slurm sends it through
     `--signal=USR2@lead` (submitit's own mechanism), orch's local executor sends it itself;
     the node's launch.sh then asks every nsys to stop, which flushes the program's NVTX ranges
     and ends the program, and waits up to `grace` seconds for the reports;
  2. at the limit, SIGTERM to whatever is left, then SIGKILL.
Without the warning, the program dies first and nsys loses its ranges.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import OrchError

DEFAULT_LIMIT_S = 3600  # what submitit and orch assume when the spec sets no time
DEFAULT_LEAD_S = 90  # submitit's own default signal delay
KILL_WAIT_S = 5  # after the limit's SIGTERM, SIGKILL (Slurm's KillWait on the local cluster)


def slurm_seconds(time: str | None) -> int:
    """Slurm time string (MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]) -> seconds."""
    if not time:
        return DEFAULT_LIMIT_S
    days, _, rest = time.rpartition("-")
    parts = [int(x) for x in rest.split(":")]
    if days:
        parts += [0] * (3 - len(parts))
        h, m, s = parts
    elif len(parts) == 3:
        h, m, s = parts
    elif len(parts) == 2:
        h, m, s = 0, parts[0], parts[1]
    else:
        h, m, s = 0, parts[0], 0
    return ((int(days or 0) * 24 + h) * 60 + m) * 60 + s


def slurm_minutes(time: str | None) -> int:
    """Slurm time string -> whole minutes (rounded up), the unit submitit expects."""
    return max(1, -(-slurm_seconds(time) // 60))


@dataclass(frozen=True)
class StopTiming:
    limit_s: int  # the job's time limit
    lead_s: int  # the early warning comes this long before it
    grace_s: int  # each nsys may take this long to write its report once asked to stop


def stop_timing(time: str | None, warn_lead_s: int | None, stop_grace_s: int) -> StopTiming:
    """The stop timing of a job; a lead the limit cannot hold is one clear error."""
    limit = slurm_seconds(time)
    if warn_lead_s is None:
        lead = max(2, min(DEFAULT_LEAD_S, limit // 2))
    elif warn_lead_s >= limit:
        raise OrchError(f"profile.warn_lead_s ({warn_lead_s} s) is not below the time limit ({limit} s): "
                        "lower it or raise slurm.time")
    else:
        lead = warn_lead_s
    return StopTiming(limit_s=limit, lead_s=lead, grace_s=stop_grace_s)
