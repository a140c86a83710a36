"""The names of a run directory's parts (layout in orchestrator/rundir.py), in a module that
imports nothing heavy: the collect's early exports ask it before pydantic or duckdb load."""

from __future__ import annotations

from pathlib import Path

MANIFEST = "manifest.json"
STORE = "profile.duckdb"


class RunPaths:
    """Every path of one run directory (the layout: orchestrator/rundir.py's docstring)."""

    def __init__(self, run: Path) -> None:
        self.run = Path(run)

    manifest = property(lambda self: self.run / MANIFEST)
    store = property(lambda self: self.run / STORE)
    scripts = property(lambda self: self.run / "scripts")
    logs = property(lambda self: self.run / "logs")
    submitit = property(lambda self: self.run / "submitit")
    reports = property(lambda self: self.run / "reports")
    dumps = property(lambda self: self.run / "dumps")
    flight_recorder = property(lambda self: self.run / "dumps" / "flight_recorder")
    exports = property(lambda self: self.run / "exports")
    parts = property(lambda self: self.run / "parts")
    submitit_collect = property(lambda self: self.run / "submitit-collect")
