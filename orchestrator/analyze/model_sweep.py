"""The typed result of `orch sweep`: one point per job of the sweep, what its report says, and
the best one; made by orchestrator/sweep.py, shown by report/sweep_render.py, written as
sweep.json."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Point(BaseModel):
    """One job of the sweep and what its report says."""

    model_config = ConfigDict(extra="forbid")
    values: dict[str, str]
    job_id: str | None = None
    run: str | None = None
    state: str = "not run"
    step_ms: float | None = None
    gpu_idle_pct: float | None = None
    waiting_ms_per_step: float | None = None
    top_finding: str | None = None
    report_html: str | None = None
    error: str | None = None

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.values.items())


class Sweep(BaseModel):
    model_config = ConfigDict(extra="forbid")
    job: str
    keys: list[str]
    gpu: bool = False
    notes: list[str] = []
    points: list[Point]
    best: int | None = None
