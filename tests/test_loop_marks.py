"""orch's loop marks (templates/orch_loop_marks.py.j2) in real jobs: the eager GPT of
scripts/workloads/modern_loops.py on CPU with no NVTX of its own, 4 micro-batches to each of 6
optimizer steps, a DataLoader with no workers, through `orch submit --wait` under real nsys. The
rank hook wraps every optimizer step and every wait for a batch in an NVTX range (plain sqlite3
over the rank's export counts them against the program's own arguments), notes the loader's
settings, and the report's steps are the optimizer steps; each epoch's start of its batches is a
range too; with `profile.module_marks` the model's forward and each backward are ranges too;
`profile.loop_marks: false` makes none.
The same hook samples the main thread's Python stack from the first optimizer step (instant
ranges in domain `orch.py`, named by the program's own functions); `python_sampling_ms: 0` takes
no sample, and the program's exit status is its own either way."""

from __future__ import annotations

import ast
import json
import sqlite3
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, run_orch

WORKLOAD = REPO / "scripts" / "workloads" / "modern_loops.py"

pytestmark = [pytest.mark.jobs, pytest.mark.nsys]

STEPS, ACCUM = 6, 4
ARGS = ["--device", "cpu", "--dim", "64", "--layers", "2", "--heads", "2", "--seq", "32", "--vocab", "100",
        "--batch", "4", "--steps", str(STEPS), "--warmup", "2", "--accum", str(ACCUM), "--log-every", "100"]


def _run(tmp: Path, marks: bool, args: tuple[str, ...] = ()) -> tuple[Path, dict]:
    spec = {"name": "marks", "cluster": "local", "run_root": str(tmp / "runs"),
            "launch": {"script": str(WORKLOAD), "nproc_per_node": 1,
                       "args": [*ARGS, *args]},
            "profile": {"ranks": "all", "trace": ["nvtx", "osrt"], "loop_marks": marks, "module_marks": marks,
                        "python_sampling_ms": 1 if marks else 0}}
    (tmp / "job.yaml").write_text(yaml.safe_dump(spec))
    p = run_orch("submit", str(tmp / "job.yaml"), "--wait", cwd=tmp)
    assert p.returncode == 0, p.stdout + p.stderr
    (run,) = (tmp / "runs").iterdir()
    assert run_orch("collect", str(run)).returncode == 0
    r = run_orch("report", str(run), "--json", str(tmp / "r.json"))
    assert r.returncode == 0, r.stderr
    return run, json.loads((tmp / "r.json").read_text())


def _ranges(run: Path) -> dict[str, int]:
    (export,) = (run / "exports").glob("*.sqlite")
    con = sqlite3.connect(export)
    if not con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'NVTX_EVENTS'").fetchone()[0]:
        return {}  # nsys writes no table for no range
    rows = con.execute("SELECT coalesce(e.text, s.value), count(*) FROM NVTX_EVENTS e LEFT JOIN StringIds s "
                       "ON s.id = e.textId WHERE e.eventType IN (59, 60) GROUP BY 1").fetchall()
    con.close()
    return dict(rows)


def _samples(run: Path) -> list[str]:
    """The names of the ranges in NVTX domain `orch.py` (orch's Python samples)."""
    (export,) = (run / "exports").glob("*.sqlite")
    con = sqlite3.connect(export)
    if not con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'NVTX_EVENTS'").fetchone()[0]:
        return []
    rows = con.execute("SELECT coalesce(e.text, s.value) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                       "WHERE e.eventType IN (59, 60) AND e.domainId IN (SELECT domainId FROM NVTX_EVENTS "
                       "WHERE eventType = 75 AND text = 'orch.py')").fetchall()
    con.close()
    return [r[0] for r in rows]


def test_the_marks_make_the_optimizer_steps_the_steps_and_note_the_loader(tmp_path: Path, nsys: str) -> None:
    run, rep = _run(tmp_path, marks=True)
    ranges = _ranges(run)
    assert ranges["orch: optimizer.step"] == STEPS
    assert ranges["orch: next batch"] >= STEPS * ACCUM  # each micro-batch's, and the DataLoader's last
    assert ranges["orch: loader start"] == 1  # one epoch holds every step
    assert "step 0" not in ranges  # the program opens no range of its own
    # module_marks: the model's forward and the backward of each micro-batch (the loss is computed
    # inside the model's forward with the functional cross_entropy: no other outermost module call)
    assert ranges["orch: forward"] == STEPS * ACCUM and ranges["orch: backward"] == STEPS * ACCUM
    assert {"orch: forward", "orch: backward"} <= {p["range"] for p in rep["tables"]["phases"]}
    assert rep["window"]["step_source"].startswith("orch's loop marks")
    assert len(rep["steps"]) == STEPS and "0" in rep["loaders"]
    (loader,) = rep["loaders"]["0"]
    assert loader["num_workers"] == 0 and loader["batch_size"] == 4 and loader["dataset"] == "Tokens"
    samples = _samples(run)
    assert samples and all(" (" in t for t in samples)
    own = tuple(f"(modern_loops.py:{line})" for line in _def_lines(WORKLOAD, ("Block.forward", "GPT.forward", "run")))
    assert any(t.split(" | ")[0].endswith(own) for t in samples), (own, samples[:20])  # the program's own frames


def _def_lines(path: Path, names: tuple[str, ...]) -> list[int]:
    """The `def` lines (a sample names a frame by its function's first line) of `names`, each
    `func` or `Class.method`, in the source at `path`."""
    tree = ast.parse(path.read_text())
    found = {f"{c.name}.{f.name}": f.lineno for c in tree.body if isinstance(c, ast.ClassDef)
             for f in c.body if isinstance(f, ast.FunctionDef)}
    found |= {f.name: f.lineno for f in tree.body if isinstance(f, ast.FunctionDef)}
    return [found[n] for n in names]


def test_each_epochs_start_is_a_range_and_the_loader_says_its_workers_are_not_persistent(
        tmp_path: Path, nsys: str) -> None:
    """A dataset of 2 optimizer steps an epoch, 2 workers that start anew every epoch
    (persistent_workers=False): each of the 3 epochs starts its batches in `orch: loader start`."""
    run, rep = _run(tmp_path, marks=True, args=("--epoch-steps", "2", "--workers", "2", "--no-persistent"))
    ranges = _ranges(run)
    assert ranges["orch: loader start"] == STEPS // 2 and ranges["orch: optimizer.step"] == STEPS
    (loader,) = rep["loaders"]["0"]
    assert loader["num_workers"] == 2 and loader["persistent_workers"] is False


def test_loop_marks_false_makes_none(tmp_path: Path, nsys: str) -> None:
    run, rep = _run(tmp_path, marks=False)
    assert not [t for t in _ranges(run) if t.startswith("orch:")] and not _samples(run)
    assert not (run / "dumps" / "loaders.r0.jsonl").exists() and rep["loaders"] == {}
    assert not rep["window"]["step_source"].startswith("orch's loop marks")
