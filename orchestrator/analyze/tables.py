"""Build `Report.tables` (the nsys stats tables across ranks) from the analysis views."""

from __future__ import annotations

from orchestrator.analyze.engine import Options, Views
from orchestrator.analyze.model_tables import StatsTables


def build_tables(v: Views, opts: Options) -> StatsTables:
    return StatsTables()
