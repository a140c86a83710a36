"""Which rank wrote which report: from orch's file names, from the captured environment,
and only as a last resort from file order (with a warning). Never guessed silently."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.collect import numbers
from orchestrator.collect.consistency import job_warnings
from orchestrator.collect.gather import ReportFile
from orchestrator.collect.probe import Probe


@dataclass
class Layout:
    """Enough of the job's shape to place ranks on nodes and stages."""

    world_size: int | None = None
    nproc_per_node: int | None = None
    tp: int = 1
    pp: int = 1
    dp: int | None = None
    known: bool = False  # stage/dp/tp indices are only filled when a layout was given

    def place(self, rank: int) -> dict[str, int | None]:
        dp = self.dp or (self.world_size // (self.tp * self.pp) if self.world_size else None)
        return {
            "node": rank // self.nproc_per_node if self.nproc_per_node else None,
            "stage": rank // (self.tp * dp) if (self.known and dp) else None,
            "dp_index": (rank // self.tp) % dp if (self.known and dp) else None,
            "tp_index": rank % self.tp if self.known else None,
        }


@dataclass
class Member:
    report: ReportFile
    probe: Probe
    rank: int | None = None
    source: str = ""
    status: str = "ok"
    notes: list[str] = field(default_factory=list)


def _env_rank(m: Member, key: str) -> int | None:
    """A rank variable from the captured env; a bad value is a note, never an exception."""
    value, bad = numbers.optional(numbers.rank, m.probe.env.get(key), key)
    if bad:
        m.probe.notes.append(f"captured {bad}: ignored")
    return value


def _check_name_numbers(m: Member) -> None:
    """Rank and pid from the file name, range-checked: a bad rank is an error for this file."""
    if m.report.rank is not None:
        m.report.rank, bad = numbers.optional(numbers.rank, m.report.rank, "rank in the file name")
        if bad:
            m.status = "error"
            m.notes.append(bad)
    if m.report.pid is not None:
        m.report.pid, bad = numbers.optional(numbers.pid, m.report.pid, "pid in the file name")
        if bad:
            m.probe.notes.append(f"{bad}: pid not stored")


def identify(reports: list[ReportFile], probes: list[Probe]) -> tuple[list[Member], list[str]]:
    """Assign a rank to every readable report; returns members and warnings."""
    warnings: list[str] = []
    members = [Member(report=r, probe=p) for r, p in zip(reports, probes, strict=True)]
    for m in members:
        _check_name_numbers(m)
        if m.status == "error":
            continue
        env = m.probe.env
        env_rank = _env_rank(m, "RANK")
        if env_rank is None and "LOCAL_RANK" not in env:
            env_rank = _env_rank(m, "SLURM_PROCID")  # srun-launched ranks, no torchrun
        if m.report.rank is not None:
            m.rank, m.source = m.report.rank, "file name"
            if env_rank is not None and env_rank != m.rank:
                m.notes.append(f"file name says rank {m.rank} but captured RANK={env_rank}; used the name")
        elif env_rank is not None:
            m.rank, m.source = env_rank, "captured env"
    claimed: dict[int, Member] = {}
    for m in members:
        if m.probe.error or m.rank is None or m.status == "error":
            continue
        if m.rank in claimed:
            m.status = "duplicate"
            m.notes.append(f"rank {m.rank} is already claimed by {claimed[m.rank].report.origin.name}")
            continue
        claimed[m.rank] = m
    unknown = [m for m in members if not m.probe.error and m.rank is None and m.status == "ok"]
    if unknown:
        free = (r for r in range(len(members) + len(claimed)) if r not in claimed)
        for m in unknown:
            m.rank, m.source = next(free), "file order"
            claimed[m.rank] = m
        warnings.append(
            f"{len(unknown)} report(s) carry no rank in their name or captured environment; "
            "ranks were assigned in file order: " + ", ".join(f"{m.report.origin.name}->{m.rank}" for m in unknown)
        )
    return members, warnings + job_warnings(members)
