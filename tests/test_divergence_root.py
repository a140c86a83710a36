"""A rank whose collectives depart from its group's is the root of the job's end, with the line
that called the odd one, whichever rank's watchdog fired first and whatever the scheduler says.

Real gloo jobs (tests/fixtures/gloo-hangs, README there): rank 3 re-syncs its weights with a
broadcast the others never call; the job hangs to its time limit, or, with a process-group
timeout, fails with rank 1 named first. The truth is the program's own source, the dumps with
plain pickle and rank 3's `train_step` ranges over its export with plain sqlite3.

The NCCL case, where the odd rank's loop goes on (NCCL completes the mismatched pair and shifts
every later collective), cannot be made on CPUs:
the run directory is a copy of a real 4x H200 NCCL job (tests/fixtures/faults/cancel: a healthy
ResNet-50 DDP loop stopped mid-run, so every rank's loop was moving when its capture ended). Into
it go (1) Flight Recorder dumps in NCCL's own format, made from that job's real dumps, in which
rank 3 calls a collective the others never call at sequence number N (a broadcast, or an
all-reduce of other sizes, from the program's main thread at a planted frame) and every later
collective of rank 3 is shifted by one, as NCCL pairs them; and (2) what the launcher leaves when
NCCL's watchdog on rank 1 fires first: submitit's result says FAILED, torchrun names rank 1 with
its `Watchdog caught collective operation timeout`, and no stop record. `orch collect` and `orch
report` then read it as a user would. The truth is the planted dumps read back with plain
pickle, and rank 3's `Step N Start` ranges over its export (plain sqlite3)."""

from __future__ import annotations

import json
import pickle
import sqlite3
from pathlib import Path

import pytest

from tests import independent
from tests.conftest import REPO, copy_run, run_orch
from tests.test_stack_classes import copy_xz_run, line_of

pytestmark = pytest.mark.replay

CANCEL = REPO / "tests" / "fixtures" / "faults" / "cancel"
FRAME = {"filename": "/work/main/scripts/workloads/x4_train.py", "line": 50, "name": "train_step"}
TORCH = "/opt/torch/.venv/lib/python3.12/site-packages/torch/distributed"

# torchrun's report of the job's first failure, as it writes it (tests/fixtures/faults/*/submitit):
# rank 1's watchdog fired on the collective rank 3 paired differently.
LAUNCHER = """[rank1]: Traceback (most recent call last):
[rank1]:   File "/work/main/scripts/workloads/ddp_faults.py", line 146, in <module>
[rank1]:     main()
[rank1]:   File "/work/main/scripts/workloads/ddp_faults.py", line 126, in main
[rank1]:     loss.backward()
[rank1]: torch.distributed.DistBackendError: [Rank 1] Watchdog caught collective operation timeout: \
WorkNCCL(SeqNum={seq}, OpType=ALLREDUCE, NumelIn={numel}, NumelOut={numel}, Timeout(ms)=25000) ran for 25010 \
milliseconds before timing out.
E1127 18:09:20.100000 1126 torch/distributed/elastic/multiprocessing/api.py:986] failed (exitcode: 1) local_rank: 1 \
(pid: 1229) of binary: /tmp/run/scripts/rank_wrapper.sh
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
/tmp/run/scripts/rank_wrapper.sh FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-27_18:09:21
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 1228)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 1228
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_18:09:20
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : 1 (pid: 1229)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def _dump(path: Path) -> dict:
    return pickle.loads(path.read_bytes())


def _plant(run: Path, odd: str) -> tuple[int, dict]:
    """Rank 3 calls, at the first all-reduce DDP issues in the last step every rank finished, a
    collective the others never call (`odd`: another operation, or the same one with other
    sizes) from its main thread at FRAME; its later collectives move up by one. Returns N and
    the entry rank 0 has there."""
    folder = run / "dumps" / "flight_recorder"
    dumps = {r: _dump(folder / f"rank_{r}") for r in range(4)}
    common = min(max(e["collective_seq_id"] for e in d["entries"]) for d in dumps.values())
    at = {e["collective_seq_id"]: e for e in dumps[0]["entries"]}
    seq = max(s for s in range(1, common - 20) if at[s]["profiling_name"] == "nccl:all_reduce"
              and at[s - 1]["profiling_name"] == "nccl:broadcast")  # the first of a backward's
    d3 = dumps[3]
    mine = next(e for e in d3["entries"] if e["collective_seq_id"] == seq)
    extra = {**mine, "thread_name": "python3", "thread_id": "140514846300000", "state": "completed",
             "profiling_name": "nccl:broadcast" if odd == "op" else "nccl:all_reduce",
             "input_sizes": [[1]], "output_sizes": [[1]], "time_created_ns": mine["time_created_ns"] - 1000,
             "frames": [{"filename": f"{TORCH}/distributed_c10d.py", "line": 2848, "name": "broadcast"},
                        {"filename": f"{TORCH}/c10d_logger.py", "line": 81, "name": "wrapper"},
                        FRAME, {**FRAME, "line": 90, "name": "main"}]}
    out = []
    for e in d3["entries"]:
        s = e["collective_seq_id"]
        if s == seq:
            out.append(extra)
        out.append({**e, "collective_seq_id": s + 1, "op_id": s + 1, "record_id": e["record_id"] + 1}
                   if s >= seq else e)
    d3["entries"] = out
    d3["pg_status"]["0"]["last_enqueued_collective"] += 1
    (folder / "rank_3").write_bytes(pickle.dumps(d3))
    return seq, at[seq]


def _fail(run: Path, seq: int, numel: int) -> None:
    """The launcher's record of a job whose first failure was rank 1's watchdog: no stop of
    orch's, submitit's result an error with torchrun's report."""
    sub = run / "submitit"
    for p in [*sub.glob("*_stop.json"), *sub.glob(".*.cancelled")]:  # the cancel's own records
        p.unlink()
    (result,) = sub.glob("*_0_result.pkl")
    result.write_bytes(pickle.dumps(("error", LAUNCHER.format(seq=seq, numel=numel))))


def _step_of(run: Path, rank: int, utc_ns: int) -> int:
    """The `Step N Start` range of `rank`'s export holding the UTC time `utc_ns` (plain sqlite3)."""
    (f,) = [f for f in (run / "exports").glob("*.sqlite") if independent.export_rank(f) == rank]
    con = sqlite3.connect(f)
    try:
        base = con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
        t = utc_ns - base
        (name,) = con.execute("SELECT coalesce(e.text, s.value) FROM NVTX_EVENTS e LEFT JOIN StringIds s "
                              "ON s.id = e.textId WHERE coalesce(e.text, s.value) LIKE 'Step % Start' "
                              "AND e.start <= ? AND e.\"end\" >= ?", (t, t)).fetchone()
        return int(name.split()[1])
    finally:
        con.close()


@pytest.mark.parametrize("odd", ["op", "sizes"])
def test_a_rank_that_called_another_collective_is_the_root_though_another_ranks_watchdog_fired_first(
        tmp_path: Path, odd: str) -> None:
    run = copy_run(CANCEL, tmp_path / "run")
    seq, theirs = _plant(run, odd)
    _fail(run, seq, theirs["input_sizes"][0][0])
    c = run_orch("collect", str(run))
    assert c.returncode == 0, c.stderr
    r = run_orch("report", str(run), "--json", str(tmp_path / "r.json"), "--wide")
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    # The truth, read back with plain pickle: where rank 3's entries first differ from the others'.
    fr = {k: {e["collective_seq_id"]: e for e in _dump(run / "dumps" / "flight_recorder" / f"rank_{k}")["entries"]}
          for k in range(4)}
    first = min(s for s in set.intersection(*(set(x) for x in fr.values()))
                if len({(fr[k][s]["profiling_name"], str(fr[k][s]["input_sizes"])) for k in fr}) > 1)
    assert first == seq and fr[3][seq]["frames"][2] == FRAME
    step = _step_of(run, 3, fr[3][seq]["time_created_ns"])
    frame = f"{FRAME['filename']}:{FRAME['line']} ({FRAME['name']})"

    o = rep["outcome"]
    assert (o["state"], o["scheduler_state"], o["behind"]) == ("hung", "FAILED", [3]), o["line"]
    assert (o["root_frame"], o["root_from"]) == (frame, "flight_recorder")
    assert "no rank hung" not in o["line"]
    assert o["line"].startswith(f"hung (FAILED): rank(s) 3 called a collective the others never called in step "
                                f"{step} (the Flight Recorder line below), where rank(s) 0, 1, 2 waited"), o["line"]
    assert "rank 1 failed first, waiting for them (a victim): rank 1 failed first (exit status 1): " \
           "torch.distributed.DistBackendError: [Rank 1] Watchdog caught collective operation timeout" in o["line"]
    (said,) = o["flight_recorder"]
    op = "nccl:broadcast" if odd == "op" else "nccl:all_reduce"
    assert said.startswith(f"Flight Recorder, default_pg: collective #{seq} differs across ranks: rank(s) 3 called "
                           f"{op} [[1]] at {frame}, where rank(s) 0, 1, 2 called nccl:all_reduce "
                           f"{theirs['input_sizes']} in backward"), said
    top = rep["findings"][0]
    assert (top["kind"], top["ranks"], top["victims"]) == ("job_outcome", [3], [0, 1, 2])
    assert top["title"] == "the job hung (FAILED): rank(s) 3 called a collective the others did not"
    assert top["fix"].startswith(f"Rank(s) 3 called a collective the others did not at {frame}: fix that call.")
    assert "every rank must call the same collectives in the same order" in top["fix"]


GLOO = REPO / "tests" / "fixtures" / "gloo-hangs"


def _train_step_of(run: Path, rank: int, utc_ns: int) -> int:
    """Which of `rank`'s `train_step` ranges (numbered from 0 in time order) holds the UTC time
    `utc_ns` (plain sqlite3 over its export)."""
    (f,) = [f for f in (run / "exports").glob("*.sqlite") if independent.export_rank(f) == rank]
    con = sqlite3.connect(f)
    try:
        t = utc_ns - con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
        spans = con.execute("SELECT e.start, e.\"end\" FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
                            "WHERE coalesce(e.text, s.value) = 'train_step' ORDER BY e.start").fetchall()
    finally:
        con.close()
    (i,) = [i for i, (a, b) in enumerate(spans) if a <= t <= b]
    return i


@pytest.mark.parametrize(("name", "state"), [("resync-rank", "TIMEOUT"), ("resync-timeout", "FAILED")])
def test_a_real_gloo_job_whose_rank_called_a_broadcast_the_others_never_called(tmp_path: Path, name: str,
                                                                                state: str) -> None:
    run = copy_xz_run(GLOO / name, tmp_path / name)
    c = run_orch("collect", str(run))
    assert c.returncode == 0, c.stderr
    r = run_orch("report", str(run), "--json", str(tmp_path / "r.json"))
    assert r.returncode == 0, r.stderr
    rep = json.loads((tmp_path / "r.json").read_text())
    script = json.loads((run / "manifest.json").read_text())["spec"]["launch"]["script"]
    frame = f"{script}:{line_of(GLOO / name / 'program' / Path(script).name, 'dist.broadcast(p.data')} (resync)"
    fr = {k: {e["collective_seq_id"]: e for e in _dump(run / "dumps" / "flight_recorder" / f"rank_{k}")["entries"]}
          for k in range(4)}
    seq = min(s for s in set.intersection(*(set(x) for x in fr.values()))
              if len({fr[k][s]["profiling_name"] for k in fr}) > 1)
    assert [fr[k][seq]["profiling_name"] for k in range(4)] == ["gloo:all_reduce"] * 3 + ["gloo:broadcast"]
    step = _train_step_of(run, 3, fr[3][seq]["time_created_ns"])

    o = rep["outcome"]
    assert (o["state"], o["scheduler_state"], o["behind"]) == ("hung", state, [3]), o["line"]
    assert (o["root_frame"], o["root_from"]) == (frame, "flight_recorder")
    assert o["line"].startswith(f"hung ({state}): rank(s) 3 called a collective the others never called in step "
                                f"{step} (the Flight Recorder line below), where rank(s) 0, 1, 2 waited"), o["line"]
    if state == "FAILED":  # torchrun's root cause is rank 1, whose error only says it waited
        log = "".join(p.read_text(errors="replace") for p in (run / "submitit").glob("*_log.err"))
        root = log[log.rindex("Root Cause (first observed failure):"):]
        assert "rank      : 1 (local_rank: 1)" in root
        assert "rank 1 failed first, waiting for them (a victim): rank 1 failed first (exit status 1): " \
               "RuntimeError: " in o["line"]
    else:  # the stacks, beside the recorder, say the same: three wait in backward, rank 3 in its broadcast
        classes = [(c["ranks"], c["waits"].split(" (")[0], c["root"]) for c in o["stack_classes"]]
        assert classes == [([0, 1, 2], "backward", False), ([3], "torch.distributed broadcast", True)]
    top = rep["findings"][0]
    assert (top["ranks"], top["victims"]) == ([3], [0, 1, 2])
    assert top["fix"].startswith(f"Rank(s) 3 called a collective the others did not at {frame}: fix that call.")
