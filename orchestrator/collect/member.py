"""One rank's report as collect sees it: the file, what its probe read, and the rank it was
given (by identity.py) with how. Its own module so that identity and the job-level checks
(consistency.py) both use it without importing each other."""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.collect.gather import ReportFile
from orchestrator.collect.probe import Probe


@dataclass
class Member:
    report: ReportFile
    probe: Probe
    rank: int | None = None
    source: str = ""
    status: str = "ok"
    notes: list[str] = field(default_factory=list)
