"""Which rank wrote which report: from orch's file names, from the captured environment,
and only as a last resort from file order (with a warning). Never guessed silently."""

from __future__ import annotations

from orchestrator import numbers
from orchestrator.collect.consistency import job_warnings
from orchestrator.collect.gather import ReportFile
from orchestrator.collect.member import Member
from orchestrator.collect.probe import Probe
from orchestrator.layout import Layout

__all__ = ["Layout", "Member", "identify", "infer_world_size"]  # Layout and Member re-exported for callers


def _env_rank(m: Member, key: str) -> int | None:
    """A rank variable from the captured env; a bad value is a note, never an exception."""
    value, bad = numbers.optional(numbers.rank, m.probe.env.get(key), key)
    if bad:
        m.probe.notes.append(f"captured {bad}: ignored")
    return value


def _check_name_numbers(m: Member) -> None:
    """Numbers in the file name that `naming.parse` found out of range: a note on this rank
    (the rank then comes from the captured environment)."""
    m.probe.notes.extend(m.report.notes)


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


def infer_world_size(members: list[Member]) -> int | None:
    """The world size as far as the reports show it: the highest rank found + 1 (at least
    the number of ranks found). Used only to complete a partial `--layout`."""
    ranks = {m.rank for m in members if m.rank is not None and not m.probe.error}
    return max(len(ranks), max(ranks) + 1) if ranks else None
