"""orch: profile torchrun jobs rank by rank with Nsight Systems, on Slurm or locally.

The package follows the pipeline a profiling run goes through:
spec -> render -> submit -> collect (gather, export, ingest) -> analyze -> report.
The Python API (`orchestrator.analyze`, `orchestrator.open_store`) is in `api.py`.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["analyze", "open_store"]


def __getattr__(name: str) -> Any:
    # Lazy: `orch --version` and the CLI's fast paths must not import DuckDB. (`analyze` is
    # the subpackage itself once imported; it is callable: see analyze/__init__.py.)
    if name == "analyze":
        import orchestrator.analyze

        return orchestrator.analyze
    if name == "open_store":
        from orchestrator.api import open_store

        return open_store
    raise AttributeError(name)
