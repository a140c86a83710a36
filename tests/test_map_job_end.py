"""The maps of a job that ended early (tests/fixtures/faults: real failing NCCL jobs on H200s,
README there), collected on the parts route with their statistics: each map is told how the job
ended, so its statistics leave out the step its rank was stopped in, as the report leaves out
the first step some rank never finished. The report equals the in-process one, and takes from
the maps the statistics of every rank stopped in that very step; the ranks that had begun a
later one are computed from their events, as before.

Which ranks those are comes from plain sqlite3 over the exports: each rank's last `Step N
Start` range (the workload's own NVTX), the lowest of them the step the report cuts."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.collect.options import CollectOptions
from orchestrator.collect.run import collect_run
from orchestrator.metrics.engine import Options
from tests import independent
from tests.conftest import copy_run, run_orch
from tests.test_event_reads import report, spoil_event_parts
from tests.test_parts import assert_same_report, rank_lists

pytestmark = pytest.mark.replay

FAULTS = Path(__file__).parent / "fixtures" / "faults"


# timeout: the rank whose loader blocked stays a step behind the one waiting in the all-reduce;
# cancel: a healthy job cancelled while two ranks were a step ahead of the other two.
@pytest.mark.parametrize("name", ["timeout", "cancel"])
def test_the_maps_of_a_stopped_job_cut_the_step_their_rank_was_stopped_in(name: str, tmp_path: Path) -> None:
    inproc = copy_run(FAULTS / name, tmp_path / "in-process")
    parts = copy_run(FAULTS / name, tmp_path / "parts")
    c = run_orch("collect", str(inproc))
    assert c.returncode == 0, c.stderr
    c = run_orch("collect", str(parts), "--parts", "--map-stats", "--workers", "2")
    assert c.returncode == 0, c.stderr
    a, b = inproc / "profile.duckdb", parts / "profile.duckdb"
    assert_same_report(a, b)

    last = independent.last_steps(parts, "Step ", " Start")
    cut = min(last.values())
    behind = [rank for rank, step in sorted(last.items()) if step == cut]
    assert 0 < len(behind) < len(last), last  # both kinds of rank, or the case tests nothing
    # every rank has the map's statistics, these are in the report's scope, their GPU ops per step too
    assert rank_lists(b, Options(), "map_done", "map_ranks", "ops_mapped") == [sorted(last), behind, behind]


def test_a_stopped_job_whose_ranks_stopped_in_one_step_reads_no_event(tmp_path: Path) -> None:
    """The cancelled job with only the reports of the ranks that were furthest (the others
    lost): every rank was stopped in the same step, so every map's scope is the report's, and
    the per-rank files read no event (tests/test_event_reads.py). Their parts spoiled, the
    report is still the in-process one."""
    runs = {}
    for route in ("in-process", "parts"):
        run = copy_run(FAULTS / "cancel", tmp_path / route)
        last = independent.last_steps(run, "Step ", " Start")
        for f in (run / "exports").glob("*.sqlite"):
            if last[independent.export_rank(f)] < max(last.values()):
                f.unlink()
        assert 1 < len(list((run / "exports").glob("*.sqlite"))) < len(last)
        runs[route] = run
    ref = collect_run(runs["in-process"], CollectOptions(workers=2)).store
    res = collect_run(runs["parts"], CollectOptions(parts=True, summaries=True, workers=2, view_min_rows=0))
    assert {"cuda_api", "kernels", "osrt"} <= set(spoil_event_parts(res.store))
    assert report(res.store, Options()) == report(ref, Options())
