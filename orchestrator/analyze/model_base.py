"""The base of every report model: unknown keys are refused, so a renamed or misspelt field
fails loudly (in a renderer, in `orch diff` of an older JSON) instead of vanishing."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
