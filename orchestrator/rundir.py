"""Run directories: where one submission keeps its scripts, logs, reports, manifest and store.

    <root>/<name>-<timestamp>/
        manifest.json      what was submitted and what to expect (written atomically)
        scripts/           sbatch.sh, launch.sh, rank_wrapper.sh, pyhooks/ (the ranks' hook)
        logs/              Slurm/submitit logs
        submitit/          submitit's folder for the job (pickles, per-task logs)
        reports/           nsys reports (%h.%p names)
        dumps/             hang evidence: stacks.r<RANK>.txt, flight_recorder/rank_<RANK>
        exports/           SQLite exports made by `orch collect`
        parts/             Parquet parts of the map/reduce collect; submitit-collect/ its array
        profile.duckdb     the merged store

`RunPaths` (orchestrator/runpaths.py) is the one home of these names (after submitit's JobPaths): every stage asks it.
`orch status/collect/report <jobid>` find a run by its job id under the run root.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_serializer, field_validator

from orchestrator.errors import OrchError
from orchestrator.fsutil import write_json_atomic
from orchestrator.layout import CLI_KEYS, Layout
from orchestrator.runpaths import MANIFEST


def default_root() -> Path:
    return Path(os.environ.get("ORCH_RUNS", "orch-runs"))


class ExpectedReport(BaseModel):
    """One profiled rank's report: where it will appear (host and pid are globbed)."""

    rank: int
    node: int
    glob: str


class Manifest(BaseModel):
    """`manifest.json`: what was submitted and what to expect from it.

    Written once by `orch submit`; read by status, cancel and collect. Keys are those of
    earlier orch versions, so old run directories still read; keys this version does not
    know are ignored on read.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    orch_version: str
    name: str
    job_id: str
    executor: str
    cluster: str
    submitted_at: str
    spec_path: str | None = None
    spec: dict[str, Any] = {}
    cluster_config: dict[str, Any] = {}
    nodes: int
    nproc_per_node: int
    world_size: int
    gpus_per_node: int = 0
    layout: Layout = Layout()
    profiled_ranks: list[int]
    collector_ranks: list[int] = []
    gpu_metrics_set: str | None = None
    output_name: str
    report_dir: str
    report_pattern: str
    expected_reports: list[ExpectedReport]
    scripts: dict[str, str] = {}
    node_command: list[str] = []
    submitit_folder: str
    nsys: str | None = None

    @field_validator("job_id", mode="before")
    @classmethod
    def _job_id(cls, v: object) -> object:
        return str(v) if isinstance(v, int) else v

    @field_validator("layout", mode="before")
    @classmethod
    def _layout(cls, v: object) -> object:
        # Manifests before `known` was recorded always had a layout from the spec.
        return {"known": True, **v} if isinstance(v, dict) else v

    @field_serializer("layout")
    def _dump_layout(self, lay: Layout) -> dict[str, Any]:
        # Every key of the job's layout (the schedule's vpp and microbatches too: the bubble's
        # theory needs them), not the world size and node width that the manifest has beside it.
        return {**{k: getattr(lay, k) for k in CLI_KEYS}, "known": lay.known}

    def job_layout(self) -> Layout:
        """The layout with the job's world size and node width, as collect needs it. The
        schedule's keys (vpp, microbatches) and cp/ep come from the spec where the manifest's
        layout lacks them (a manifest may record only tp, pp and dp)."""
        spec = self.spec.get("layout") if isinstance(self.spec.get("layout"), dict) else {}
        more = {k: v for k in ("cp", "ep", "vpp", "microbatches")
                if getattr(self.layout, k) in (None, 1) and isinstance(v := spec.get(k), int) and v >= 1}
        return self.layout.model_copy(update={"world_size": self.world_size,
                                              "nproc_per_node": self.nproc_per_node, **more})

    def write(self, run: Path) -> None:
        write_json_atomic(run / MANIFEST, self.model_dump(mode="json"))


def read_manifest(run: Path) -> Manifest:
    path = run / MANIFEST
    try:
        return Manifest.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        raise OrchError(f"{run} has no {MANIFEST}: not an orch run directory") from None
    except OSError as e:
        raise OrchError(f"{path} cannot be read ({e.__class__.__name__}); check its permissions") from None
    except ValidationError as e:
        err = e.errors()[0]
        if err["type"].startswith("json_"):
            raise OrchError(f"{path} is corrupt (not JSON); restore it or resubmit") from None
        where = ".".join(str(x) for x in err["loc"]) or "(top level)"
        raise OrchError(f"{path} is corrupt ({where}: {err['msg']}); restore it or resubmit") from None


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
