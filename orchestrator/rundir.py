"""Run directories: where one submission keeps its scripts, logs, reports, manifest and store.

    <root>/<name>-<timestamp>/
        manifest.json      what was submitted and what to expect (written atomically)
        scripts/           sbatch.sh, launch.sh, rank_wrapper.sh
        logs/              Slurm/submitit logs
        reports/           nsys reports (%h.%p names)
        exports/           SQLite exports made by `orch collect`
        profile.duckdb     the merged store

`orch status/collect/report <jobid>` find a run by its job id under the run root.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchError

MANIFEST = "manifest.json"
STORE = "profile.duckdb"


def default_root() -> Path:
    return Path(os.environ.get("ORCH_RUNS", "orch-runs"))


def read_manifest(run: Path) -> dict[str, Any]:
    try:
        return json.loads((run / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise OrchError(f"{run} has no {MANIFEST}: not an orch run directory") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise OrchError(f"{run / MANIFEST} is corrupt (not JSON); restore it or resubmit") from None


def find_run(ref: str, root: Path | None = None) -> Path:
    """A run directory given as a path, or found by job id under the run root."""
    p = Path(ref)
    if (p / MANIFEST).is_file():
        return p
    root = root or default_root()
    matches = []
    if root.is_dir():
        for m in root.glob(f"*/{MANIFEST}"):
            try:
                if str(json.loads(m.read_text(encoding="utf-8")).get("job_id")) == ref:
                    matches.append(m.parent)
            except (OSError, json.JSONDecodeError, UnicodeDecodeError):
                continue
    if not matches:
        raise OrchError(
            f"no run with job id or directory {ref!r} under {root}; pass the run directory "
            "or set --runs/ORCH_RUNS to where `orch submit` wrote it"
        )
    return max(matches, key=lambda d: d.stat().st_mtime)
