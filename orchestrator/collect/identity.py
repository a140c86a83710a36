"""Which rank wrote which report: from orch's file names, from the captured environment,
and only as a last resort from file order (with a warning). Never guessed silently."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator import naming
from orchestrator.collect.gather import ReportFile
from orchestrator.collect.probe import Probe
from orchestrator.layout import Layout

__all__ = ["Layout", "Member", "identify", "infer_world_size"]  # Layout re-exported for callers


@dataclass
class Member:
    report: ReportFile
    probe: Probe
    rank: int | None = None
    source: str = ""
    status: str = "ok"
    notes: list[str] = field(default_factory=list)


def _rank(env: dict[str, str], key: str, notes: list[str]) -> int | None:
    """A captured rank variable, range-checked in one place (naming.checked_int)."""
    raw = env.get(key)
    value = naming.checked_int(raw, naming.MAX_RANK)
    if value is None and raw is not None and raw.strip():
        notes.append(f"captured {key}={raw[:40]!r} is not a rank (0..{naming.MAX_RANK}); ignored")
    return value


def identify(reports: list[ReportFile], probes: list[Probe]) -> tuple[list[Member], list[str]]:
    """Assign a rank to every readable report; returns members and warnings."""
    warnings: list[str] = []
    members = [Member(report=r, probe=p) for r, p in zip(reports, probes, strict=True)]
    for m in members:
        env = m.probe.env
        env_rank = _rank(env, "RANK", m.notes)
        if env_rank is None and "LOCAL_RANK" not in env:
            env_rank = _rank(env, "SLURM_PROCID", m.notes)  # srun-launched ranks, no torchrun
        if m.report.rank is not None:
            m.rank, m.source = m.report.rank, "file name"
            if env_rank is not None and env_rank != m.rank:
                m.notes.append(f"file name says rank {m.rank} but captured RANK={env_rank}; used the name")
        elif env_rank is not None:
            m.rank, m.source = env_rank, "captured env"
    claimed: dict[int, Member] = {}
    for m in members:
        if m.probe.error or m.rank is None:
            continue
        if m.rank in claimed:
            m.status = "duplicate"
            m.notes.append(f"rank {m.rank} is already claimed by {claimed[m.rank].report.origin.name}")
            continue
        claimed[m.rank] = m
    unknown = [m for m in members if not m.probe.error and m.rank is None]
    if unknown:
        free = (r for r in range(len(members) + len(claimed)) if r not in claimed)
        for m in unknown:
            m.rank, m.source = next(free), "file order"
            claimed[m.rank] = m
        warnings.append(
            f"{len(unknown)} report(s) carry no rank in their name or captured environment; "
            "ranks were assigned in file order: " + ", ".join(f"{m.report.origin.name}->{m.rank}" for m in unknown)
        )
    return members, warnings


def infer_world_size(members: list[Member]) -> int | None:
    """The world size as far as the reports show it: the highest rank found + 1 (at least
    the number of ranks found). Used only to complete a partial `--layout`."""
    ranks = {m.rank for m in members if m.rank is not None and not m.probe.error}
    return max(len(ranks), max(ranks) + 1) if ranks else None
