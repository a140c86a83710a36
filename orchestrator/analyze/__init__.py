"""Analyze stage: SQL views over the merged store (`sql/`), the typed report (`model.py`,
`report.py`) and the rules that turn metrics into findings (`rules/`).

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
