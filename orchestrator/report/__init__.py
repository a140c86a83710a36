"""Outputs of the analysis: terminal tables, JSON, HTML, diffs and a Perfetto trace."""

import json
import os
from pathlib import Path
from typing import Any


def write_json(report: dict[str, Any], path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8")
    tmp.replace(path)


def write_text(text: str, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
