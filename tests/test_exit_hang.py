"""Ranks that finish their loop and do not end: the root is what runs after the loop, not a rank
behind, and not the time limit; and orch ends such a rank once its program finished.

Real captures, the truth read without orch (plain sqlite3 over the exports, the task's log):
- tests/fixtures/exit-hang: a 2-rank gloo job of scripts/examples/train.py through `orch submit`
  on this machine, made before orch ended such ranks; both ranks ran their 6 steps and printed
  their last line, rank 1 exited, rank 0 never did, and orch stopped the job at the time limit's
  warning 1710 s later;
- a job run here: scripts/workloads/stuck_rank.py, whose rank 1 never stops its uploader thread,
  with `profile.exit_grace_s: 10`; tests/fixtures/exit-ended is one such run.
READMEs there."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, JobTree, run_orch
from tests.test_stack_classes import copy_xz_run, line_of
from tests.truth import range_ends

FIXTURE = REPO / "tests" / "fixtures" / "exit-hang"
WORKLOAD = REPO / "scripts" / "workloads" / "stuck_rank.py"


def truth(export: Path) -> tuple[int, int, int]:
    """(last step whose range closed, that range's end, the end of the last OS-runtime call), in
    the export's own ns, by sqlite3 alone (the loop thread's last range is its last step's)."""
    con = sqlite3.connect(export)
    steps = [int(t) for (t,) in con.execute(
        "SELECT substr(coalesce(e.text, s.value), 6) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
        "WHERE coalesce(e.text, s.value) LIKE 'step %' AND e.\"end\" IS NOT NULL")]
    # The store keeps the OS-runtime calls of 10 us or more (store/tables.py, OSRT_MIN_NS).
    (last_call,) = con.execute('SELECT max("end") FROM OSRT_API WHERE "end" - start >= 10000').fetchone()
    return max(steps), range_ends(con, "step %")[-1], last_call


@pytest.fixture(scope="module")
def hung(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str, str]:
    """The capture collected and reported: (run, report JSON, terminal text, HTML)."""
    run = copy_xz_run(FIXTURE, tmp_path_factory.mktemp("exit-hang") / "run")
    c = run_orch("collect", str(run))
    assert c.returncode == 0, c.stderr
    r = run_orch("report", str(run), "--json", str(run / "r.json"), "--html", str(run / "r.html"), "--wide")
    assert r.returncode == 0, r.stderr
    return run, json.loads((run / "r.json").read_text()), r.stdout, (run / "r.html").read_text()


@pytest.mark.replay
def test_the_rank_that_never_exited_after_its_last_step_is_the_root(hung) -> None:
    run, rep, text, html = hung
    # Both ranks printed the program's last line (after destroy_process_group), as the log says.
    log = (run / "submitit" / "19978_0_log.out").read_text()
    assert {int(m) for m in re.findall(r"rank (\d) stage 0 done", log)} == {0, 1}
    exports = {int(re.search(r"_r(\d)_", p.name).group(1)): p for p in (run / "exports").glob("*.sqlite")}
    t = {r: truth(p) for r, p in exports.items()}
    assert {r: v[0] for r, v in t.items()} == {0: 5, 1: 5}
    ran_on = {r: (last - end) / 1e9 for r, (_, end, last) in t.items()}
    assert ran_on[0] > 1000 > 1 > ran_on[1] > 0.1, ran_on
    o = rep["outcome"]
    assert (o["state"], o["scheduler_state"], o["behind"], o["never_exited"], o["root_from"]) == \
        ("hung", "TIMEOUT", [0], [0], "trace"), o["line"]
    for r in o["ranks"]:
        # Every range closed by the program: no rank was inside a step when its capture ended.
        assert (r["last_step"], r["last_done_step"], r["open_ranges"]) == (5, 5, []), r
        assert r["ran_on_s"] == pytest.approx(ran_on[r["rank"]], abs=0.06)
    assert o["line"].startswith("hung (TIMEOUT): rank(s) 0 finished every step (the last, 5) but never exited")
    assert "while rank(s) 1 exited" in o["line"]
    top = rep["findings"][0]
    assert (top["kind"], top["ranks"], top["victims"], top["severity"]) == ("job_outcome", [0], [], "high")
    assert top["title"] == "the job hung (TIMEOUT): rank(s) 0 finished every step but never exited"
    assert "slurm.time" not in top["fix"] and "destroy_process_group" in top["fix"]
    assert "rank 0: last finished step 5, then went on 1726.5 s outside its ranges" in top["evidence"]
    assert "finished every step but never exited" in " ".join(text.split())
    assert "then went on 1726.5 s outside its ranges" in html


@pytest.mark.jobs
@pytest.mark.nsys
def test_a_rank_whose_thread_never_ends_is_ended_after_its_grace(tmp_path: Path, nsys: str, tree: JobTree) -> None:
    """A real 2-rank gloo job (scripts/workloads/stuck_rank.py): rank 1 hands its losses to an
    uploader thread that is never told to stop, so its process never ends once its loop is done.
    orch ends it `exit_grace_s` after its program finished, the job completes long before its time
    limit, its report keeps every step, and the report names the thread's line."""
    spec = {"name": "uploader", "cluster": "local", "run_root": str(tmp_path / "runs"), "slurm": {"time": "05:00"},
            "launch": {"script": str(WORKLOAD), "nproc_per_node": 2, "args": ["--steps", "20", "--uploader-rank", "1"],
                       "env": {"GLOO_SOCKET_IFNAME": "lo"}},
            "profile": {"ranks": "all", "trace": ["nvtx", "osrt"], "exit_grace_s": 10}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    p = tree.orch("submit", str(tmp_path / "job.yaml"), "--wait", "--timeout", "240")
    assert p.returncode == 0 and "COMPLETED" in p.stdout + p.stderr, p.stdout + p.stderr
    assert "rank 1: its program finished but did not exit: orch ended it 10 s later" in p.stdout
    assert tree.survivors() == []
    (run,) = (tmp_path / "runs").iterdir()
    # Not the time limit's stop: no stop record; both programs printed their last line.
    assert not list((run / "submitit").glob("*_stop.json"))
    log = "".join(f.read_text() for f in (run / "submitit").glob("*_log.out"))
    assert {int(m) for m in re.findall(r"^rank (\d) done", log, re.M)} == {0, 1}
    assert (run / "dumps" / "exit_hang.r1").read_text().split() == ["10", "ok"]
    assert not (run / "dumps" / "exit_hang.r0").exists()
    upload = line_of(WORKLOAD, "losses.get()")
    # faulthandler's dump, halfway through the grace: the uploader thread in its queue's get.
    assert f'File "{WORKLOAD}", line {upload} in upload' in (run / "dumps" / "stacks.r1.txt").read_text()
    # Every step of rank 1 is in its report, closed (plain sqlite3 over its export).
    (export,) = (run / "exports").glob("*_r1_*.sqlite")
    assert len(range_ends(sqlite3.connect(export), "train_step")) == 20
    assert tree.orch("collect", str(run)).returncode == 0
    r = tree.orch("report", str(run), "--json", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    o = rep["outcome"]
    assert (o["state"], o["scheduler_state"]) == ("completed", "COMPLETED")
    assert o["line"] == "completed (COMPLETED): rank(s) 1 finished but did not exit: orch ended it 10 s later " \
                        "(profile.exit_grace_s)"
    ends = {x["rank"]: x for x in o["ranks"]}
    assert (ends[1]["exit_grace_s"], ends[1]["exit_threads"]) == (10, [f"{WORKLOAD}:{upload} (upload)"])
    assert (ends[0]["exit_grace_s"], ends[0]["exit_threads"]) == (None, [])
    top = rep["findings"][0]
    assert (top["kind"], top["ranks"], top["severity"]) == ("job_outcome", [1], "medium")
    assert "daemon=True" in top["fix"] and "dumps/stacks.r1.txt" in top["fix"]


@pytest.mark.replay
def test_the_rank_orch_ended_after_its_program_finished_is_named_with_its_thread(tmp_path: Path) -> None:
    """The real capture of the job above (tests/fixtures/exit-ended, README there), collected as a
    user who copied the run: the report names rank 1 and the line its thread waited at."""
    run = copy_xz_run(REPO / "tests" / "fixtures" / "exit-ended", tmp_path / "run")
    assert run_orch("collect", str(run)).returncode == 0
    r = run_orch("report", str(run), "--json", str(run / "r.json"))
    assert r.returncode == 0, r.stderr
    rep = json.loads((run / "r.json").read_text())
    script = json.loads((run / "manifest.json").read_text())["spec"]["launch"]["script"]
    upload = line_of(run / "program" / "stuck_rank.py", "losses.get()")
    o = rep["outcome"]
    assert (o["state"], o["behind"]) == ("completed", [])
    ends = {x["rank"]: x for x in o["ranks"]}
    assert (ends[1]["exit_grace_s"], ends[1]["exit_threads"]) == (10, [f"{script}:{upload} (upload)"])
    top = rep["findings"][0]
    assert (top["kind"], top["ranks"], top["severity"]) == ("job_outcome", [1], "medium")
    assert top["title"] == "rank(s) 1 finished but did not exit: orch ended it after 10 s (profile.exit_grace_s)"
