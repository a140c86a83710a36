"""The `nsys stats` / `nsys analyze` tables across ranks, as typed models (Report.tables)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StatsTables(BaseModel):
    """Per-rank tables side by side (filled by analyze/tables.py)."""

    model_config = ConfigDict(extra="forbid")
