"""A fault as users write it, not planted where orch looks: PyTorch's DDP tutorial model with the
evaluation most scripts add, run on the main process only, whose loss is averaged by the
helper the training loop also uses (scripts/workloads/ddp_tutorial_eval.py). The main
process's all-reduce meets the other rank's gradient all-reduce: gloo aborts on the size check
(NCCL would hang). Through `orch submit` on the local executor with real nsys: the outcome must
name the rank, the native error, and where in the program it was; the fix must say to call
collectives on every rank; nothing of the job may survive."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, JobTree

pytestmark = [pytest.mark.jobs, pytest.mark.nsys]

SCRIPT = REPO / "scripts" / "workloads" / "ddp_tutorial_eval.py"


def test_collective_called_on_the_main_process_only(tmp_path: Path, nsys: str, tree: JobTree) -> None:
    spec = {"name": "tutorial", "cluster": "local", "run_root": str(tmp_path / "runs"), "slurm": {"time": "05:00"},
            "launch": {"script": str(SCRIPT), "nproc_per_node": 2, "args": ["--steps", "40", "--eval-every", "10"],
                       "env": {"GLOO_SOCKET_IFNAME": "lo"}},
            "layout": {"tp": 1, "pp": 1}, "profile": {"ranks": "all", "trace": ["nvtx", "osrt"]}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    p = tree.orch("submit", str(tmp_path / "job.yaml"), "--wait", "--timeout", "200")
    assert p.returncode == 1 and p.stderr.strip().splitlines()[-1].endswith("FAILED (2/2 reports)"), p.stdout + p.stderr
    assert tree.survivors() == []
    (run,) = (tmp_path / "runs").iterdir()
    assert tree.orch("collect", str(run)).returncode == 0
    r = tree.orch("report", str(run), "--json", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    o = rep["outcome"]
    # The evaluation runs in step 10 on rank 0 only; rank 1 has gone on to step 11's backward.
    assert o["state"] == "failed" and o["line"].startswith(
        "failed (FAILED): rank 0 failed first (killed by SIGABRT (exit status 134; "), o["line"]
    assert "Is there a distributed collective mismatch in your code?" in o["line"]
    ends = {x["rank"]: x for x in o["ranks"]}
    # A process that aborts loses the NVTX events its nsys injection had not flushed yet: the
    # `evaluate` range, pushed a few ms before the abort, is there on most runs, not on all, and
    # on a busy machine the loss can reach back to `backward`'s end (`backward` then reads open).
    # What orch reports is what was recorded: step 10, open, and at most one of its own ranges
    # inside it. The stack below says where the rank was either way.
    opened = ends[0]["open_ranges"]
    assert opened[0] == "step 10" and len(opened) <= 2, ends[0]
    assert set(opened[1:]) <= {"backward", "optimizer", "evaluate"}, ends[0]
    assert ends[0]["last_done_step"] == 9
    assert ends[1]["open_ranges"] == ["step 11", "backward"] and ends[1]["last_done_step"] == 10
    # Where rank 0 was when it aborted, from the stack the rank hook wrote on SIGABRT.
    stack = ends[0]["stack"]
    assert stack[0].startswith("all_reduce (") and any(s.startswith("mean_across_ranks (") for s in stack)
    assert any(s.startswith("evaluate (workloads/ddp_tutorial_eval.py:") for s in stack), stack
    top = rep["findings"][0]
    assert top["kind"] == "job_outcome" and top["ranks"] == [0]
    assert "every rank must call the same collectives in the same order" in top["fix"]
    assert all(f["kind"] != "healthy" for f in rep["findings"])
