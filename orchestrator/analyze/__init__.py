"""Analyze stage: the typed report built from the metrics' views, and the rules that turn
metrics into findings.

The layout, in the order the analysis runs:
- the metrics (orchestrator/metrics/: the SQL files and the engine that runs them over the
  store and reads the views), which this package turns into the report;
- one builder beside one model per part of the report: `build.py` -> `model_report.py` (the
  `Report`: ranks, steps, stages, stragglers, window, findings), `comm.py` -> `model_comm.py`,
  `critical.py` -> `model_critical.py`, `gpu_memory.py` -> `model_gpu_memory.py`, `outcome.py`
  (with `flight.py`) -> `model_outcome.py`, `overhead.py` -> `model_overhead.py`,
  `stats_tables.py` -> `model_stats_tables.py`, `timeline.py` -> `model_timeline.py` (the HTML's
  timeline and `orch sweep`'s step times); `model_base.py` and `model_columns.py` serve them all.
- `rules/`: one rule per file.
- shared by all: `rank_pick.py` (which ranks a view shows when there are too many) and
  `units.py` (the one ns -> ms conversion).

`orchestrator.analyze(paths, layout=...)` is also the Python API's entry point (api.py):
this package is both, because `import orchestrator as orch; orch.analyze(...)` must keep
working after anything imported the subpackage (which rebinds `orchestrator.analyze`).
"""

from __future__ import annotations

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from orchestrator.api import analyze

        return analyze(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
