"""Real failing multi-GPU jobs (tests/fixtures/faults: the tutorial's ResNet-50 DDP trainer on 2
H200s, NCCL, each with one real fault, submitted by orch; README there): each run directory is
collected and reported as a user would after copying it here, and checked against plain sqlite3
over its exports (tests/independent.py) and the job's own log.

What a stopped NCCL rank keeps, what a killed one loses, which rank the hang is blamed on, and
how much memory the rank that ran out held are the questions."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests import independent
from tests.conftest import REPO, run_orch
from tests.stores import Stores

pytestmark = pytest.mark.replay

FAULTS = REPO / "tests" / "fixtures" / "faults"


@pytest.fixture(scope="module")
def runs(stores: Stores) -> dict[str, tuple[Path, dict, str]]:
    """Each fixture run copied as a moved run directory (exports only, no .nsys-rep), then
    `orch collect RUN` and `orch report RUN --json --wide`: (run, report JSON, terminal text),
    the session's shared copy (tests/stores.py)."""
    names = sorted(p.name for p in FAULTS.iterdir() if p.is_dir())
    stores.cases([f"faults-{n}" for n in names])
    return {n: stores.report(f"faults-{n}") for n in names}


def _kernels(run: Path) -> dict[int, int]:
    """Kernels per rank, counted in the exports with plain sqlite3 (rank from the file name)."""
    return {independent.export_rank(f): independent.kernel_count(f)
            for f in sorted((run / "exports").glob("*.sqlite"))}


def _store_kernels(run: Path) -> dict[int, int]:
    import duckdb

    con = duckdb.connect(str(run / "profile.duckdb"), read_only=True)
    try:
        return dict(con.execute("SELECT rank, count(*) FROM kernels GROUP BY rank ORDER BY rank").fetchall())
    finally:
        con.close()


def test_a_rank_stuck_at_the_time_limit_is_the_root_and_every_rank_keeps_its_kernels(runs) -> None:
    run, rep, _ = runs["timeout"]
    kernels = _kernels(run)
    assert all(n > 10_000 for n in kernels.values()), kernels  # the release kept both ranks' GPU side
    assert _store_kernels(run) == kernels
    o = rep["outcome"]
    assert (o["state"], o["scheduler_state"], o["behind"], o["gpu_lost"]) == ("hung", "TIMEOUT", [1], [])
    top = rep["findings"][0]
    assert (top["kind"], top["ranks"]) == ("job_outcome", [1])
    assert top["fix"].startswith("Rank 1 is the root") and "DataLoader" in top["fix"]
    # The log says which rank's loader was stuck (the workload's own words never name it: the
    # stack dump does): rank 1's main thread waits in the DataLoader.
    assert "dataloader" in " ".join(next(r["stack"] for r in o["ranks"] if r["rank"] == 1))
    # The hung step is evidence of the stop, never a performance finding: rank 0 finished step
    # 12 on the CPU while its all-reduce waited 50 s for rank 1.
    assert "exposed_communication" not in {f["kind"] for f in rep["findings"]}
    assert "in backward (the autograd thread: DDP's gradient all-reduce)" in " ".join(o["flight_recorder"])


def test_memory_per_rank_from_its_own_gpu_and_at_the_out_of_memory_failure(runs) -> None:
    run, rep, _ = runs["oom"]
    truth = {independent.export_rank(f): independent.gpu_memory_peak(f)
             for f in sorted((run / "exports").glob("*.sqlite"))}
    assert {r: d for r, (d, _) in truth.items()} == {0: 0, 1: 1}  # each rank on its own GPU
    mem = {r["rank"]: r for r in rep["memory"]["ranks"]}
    assert {r: m["device"] for r, m in mem.items()} == {0: 0, 1: 1}
    assert mem[1]["capture_peak_bytes"] == truth[1][1]  # rank 1 read GPU 0's static loads before: 0.00 GiB
    assert mem[0]["capture_peak_bytes"] == truth[0][1]
    o = rep["outcome"]
    assert o["state"] == "failed" and "rank 0 failed first" in o["line"] and "OutOfMemoryError" in o["line"]
    assert o["ran_out"] == 0
    # The rank that ran out, how much it held and when, and the other rank then.
    assert f"rank 0 held {truth[0][1] / 2**30:.2f} GiB of its GPU's 139.8 GiB at its highest, in step 12" in o["line"]
    assert f"the others then: rank 1 {truth[1][1] / 2**30:.2f} GiB" in o["line"]
    top = rep["findings"][0]
    assert (top["title"], top["ranks"]) == ("the job failed (FAILED): rank 0 ran out of GPU memory", [0])
    assert top["fix"].startswith("Rank 0 ran out of GPU memory")
    assert all(n > 10_000 for n in _kernels(run).values())


def test_a_killed_rank_lost_its_gpu_trace_and_says_so(runs) -> None:
    run, rep, text = runs["sigkill"]
    kernels = _kernels(run)
    assert kernels[1] == 0 and kernels[0] > 10_000  # SIGKILL: CUPTI never handed rank 1's kernels over
    o = rep["outcome"]
    assert o["gpu_lost"] == [1] and "rank 1 failed first (killed by SIGKILL" in o["line"]
    assert "GPU trace lost on rank(s) 1" in text
    # Rank 0's all-reduces waited for a rank without kernels: not attributable, no finding; and
    # rank 0's GPU time per range is no outlier against a rank that has none to show.
    assert "exposed_communication" not in {f["kind"] for f in rep["findings"]}
    assert not [p for p in rep["tables"]["phases"] if p["gpu_outlier"]]


def test_the_rank_that_never_entered_is_the_root_also_when_a_watchdog_ends_the_job(runs, tmp_path: Path) -> None:
    run, rep, _ = runs["watchdog"]
    o = rep["outcome"]
    # As it ran (watchdog under TORCH_NCCL_ASYNC_ERROR_HANDLING=2 without the release on its way
    # out: rank 1's exit hung until the time limit and lost its kernels), rank 0 is the root.
    assert (o["state"], o["behind"], o["gpu_lost"]) == ("hung", [0], [1])
    assert rep["findings"][0]["ranks"] == [0]
    # The same store as a job that ended FAILED because rank 1's watchdog fired first (what the
    # launcher reports once that rank's exit releases it): rank 1 is a victim, rank 0 the root.
    import duckdb

    run = Path(shutil.copytree(run, tmp_path / "run", ignore=shutil.ignore_patterns("*.sqlite")))  # shared: a copy
    store = run / "profile.duckdb"
    con = duckdb.connect(str(store))
    ev = json.loads(con.execute("SELECT value FROM meta WHERE key = 'job'").fetchone()[0])
    ev["state"] = "FAILED"
    ev["stop"] = None
    ev["tasks"][0].update(failed_rank=1, failed_exit="exit status 1", failed_by_peer=True,
                          error="rank 1 failed first (exit status 1): torch.distributed.DistBackendError: "
                                "NCCL communicator was aborted on rank 1.")
    con.execute("UPDATE meta SET value = ? WHERE key = 'job'", [json.dumps(ev)])
    con.close()
    r = run_orch("report", str(run), "--json", str(tmp_path / "failed.json"))
    assert r.returncode == 0, r.stderr
    failed = json.loads((tmp_path / "failed.json").read_text())
    fo = failed["outcome"]
    assert (fo["state"], fo["scheduler_state"], fo["behind"]) == ("hung", "FAILED", [0])
    assert "rank 1 failed first, waiting for them (a victim)" in fo["line"]
    assert failed["findings"][0]["ranks"] == [0] and failed["findings"][0]["fix"].startswith("Rank 0 is the root")


def _recorded(run: Path) -> dict[int, list[dict]]:
    """Each rank's Flight Recorder entries, read with plain pickle (not orch's reader)."""
    import pickle

    return {int(p.name.split("_")[1]): pickle.loads(p.read_bytes())["entries"]
            for p in sorted((run / "dumps" / "flight_recorder").glob("rank_*"))}


def test_a_collective_only_one_rank_called_is_the_root_where_the_ranks_first_parted(runs) -> None:
    """4x H200: rank 1 averages its loss across ranks for a log line in step 8, the others do
    not. NCCL paired its one-element all-reduce with the others' buffer broadcast, and every later
    collective of rank 1 with a different one: the job hung at the time limit with rank 0 the
    furthest, ranks 1-3 behind, and each rank's last collective a different number."""
    run, rep, _ = runs["extra-collective"]
    kernels = _kernels(run)
    assert sorted(kernels) == [0, 1, 2, 3] and all(n > 5_000 for n in kernels.values()), kernels
    assert _store_kernels(run) == kernels
    # Ground truth from the recorder itself: the first sequence number where the ranks' entries differ.
    fr = _recorded(run)
    seqs = set.intersection(*({e["collective_seq_id"] for e in es} for es in fr.values()))
    at = {r: {e["collective_seq_id"]: e for e in es} for r, es in fr.items()}
    seq = min(s for s in seqs if len({(at[r][s]["profiling_name"], str(at[r][s]["input_sizes"])) for r in at}) > 1)
    odd = [r for r in at if at[r][seq]["profiling_name"] != at[0 if r else 2][seq]["profiling_name"]]
    assert odd == [1] and at[1][seq]["profiling_name"] == "nccl:all_reduce"
    line = next(f for f in at[1][seq]["frames"] if f["name"] == "main")
    o = rep["outcome"]
    assert (o["state"], o["scheduler_state"], o["behind"], o["gpu_lost"]) == ("hung", "TIMEOUT", [1], [])
    (said,) = o["flight_recorder"]
    assert said.startswith(f"Flight Recorder, default_pg: collective #{seq} differs across ranks: rank(s) 1 called "
                           f"nccl:all_reduce [[]] at {line['filename']}:{line['line']} (main), where rank(s) 0, 2, 3 "
                           "called nccl:broadcast [[53120]]"), said
    top = rep["findings"][0]
    assert (top["kind"], top["ranks"], top["victims"]) == ("job_outcome", [1], [0, 2, 3])
    assert top["title"] == "the job hung (TIMEOUT): rank(s) 1 called a collective the others did not"
    # The step it called it in, from the recorder's time in the rank's own step ranges: the
    # program printed its mean loss right after that all-reduce.
    (logged,) = re.findall(r"^step (\d+): mean loss", _log(run), re.M)
    assert f"called a collective the others never called in step {logged} (" in o["line"], o["line"]
    assert "every rank must call the same collectives in the same order" in top["fix"]


def test_a_rank_whose_report_nsys_could_not_write_is_named_and_its_stack_still_tells_the_root(runs) -> None:
    """4x H200: rank 0's read blocks in step 8; the others' NCCL watchdog aborts after 25 s, but
    ranks 2 and 3 stay in backward until the time limit. nsys 2025.3.1 could not import the raw
    streams of ranks 0 and 3 ("Multiple different definitions of the same VmTidToPidInfo"); rank
    2's export is left out of the fixture for its size (11 MB of OS-runtime polling)."""
    run, rep, _ = runs["watchdog-4gpu"]
    log = next((run / "submitit").glob("*_log.err")).read_text()
    assert "Multiple different definitions of the same VmTidToPidInfo" in log
    o = rep["outcome"]
    assert (o["state"], o["behind"]) == ("hung", [0])
    assert "no report from rank(s) 0, 3: QdstrmImporter could not turn the raw stream into it" in o["line"]
    assert sorted(rep["missing_ranks"]) == [0, 2, 3]
    top = rep["findings"][0]
    assert (top["ranks"], top["victims"]) == ([0], [1, 2, 3])
    # Rank 0 left no report, but its stack dump says where it was: waiting for its DataLoader.
    assert top["fix"].startswith("Rank 0 is the root (its main thread waited for its DataLoader, ")
    assert "never entered collective" in " ".join(o["flight_recorder"])


def test_the_rank_furthest_behind_is_the_root_and_the_ranks_between_are_victims() -> None:
    """4x H200, rank 1's read blocks in step 8 until the time limit (the run's exports, too large
    to keep here; the last `Step N Start` range each rank began, plain sqlite3: 9, 7, 8, 8). Ranks 2
    and 3 waited in step 8's all-reduce and rank 0's CPU ran ahead into step 9: only rank 1
    never reached step 8, and ranks 2 and 3 are its victims, not roots beside it."""
    from orchestrator.analyze.outcome import behind

    ends = [{"rank": r, "last_step": s, "furthest_offset_ns": None} for r, s in ((0, 9), (1, 7), (2, 8), (3, 8))]
    assert behind(ends) == ([1], "step 8")
    # Within one step: the rank whose furthest phase is earliest, and the phase the next rank reached.
    same = [{"rank": 0, "last_step": 4, "furthest_offset_ns": 30, "furthest": "backward"},
            {"rank": 1, "last_step": 4, "furthest_offset_ns": 10, "furthest": "data_load"},
            {"rank": 2, "last_step": 4, "furthest_offset_ns": 20, "furthest": "forward"}]
    assert behind(same) == ([1], "forward of step 4")


def test_a_stop_of_a_moving_loop_is_no_hang_whether_or_not_its_time_was_recorded() -> None:
    """Where each rank's loop thread stood still when its capture ended, from two real 4x H200
    stores (rank_end: still_ns, step_ns). A cancel 75 s into a healthy job, before orch recorded
    the stop's time: every rank stood still 1.13-1.43 s (the stop's dumps and release), ranks 0
    and 1 a step behind, 0.13 s and 0.30 s before rank 2 stopped: moving. The watchdog run: every
    rank still for 110 s: rank 0 hung. With the stop's own time the same ranks are judged by it."""
    from orchestrator.analyze.outcome import running

    def ends(still_s: list[float], step_s: float) -> list[dict]:
        return [{"rank": r, "still_ns": int(s * 1e9), "step_ns": int(step_s * 1e9), "end_ns": 20 * 10**9}
                for r, s in enumerate(still_s)]

    cancel = ends([1.2557, 1.4258, 1.1287, 1.1895], 0.0556)
    assert running(cancel, [0, 1]).startswith("rank 0 began its last range 0.13 s before the stop")
    hang = ends([110.23, 110.48, 110.06, 110.15], 0.0514)
    assert running(hang, [0]) == ""
    # Recorded: the stop came 1.2 s before the captures ended; rank 1 had stood still 0.23 s by then.
    assert "rank 1 began its last range 0.23 s" in running(cancel, [1], stop_ns=20 * 10**9 - int(1.2e9))
    assert running(cancel, [1], stop_ns=20 * 10**9 - int(0.5e9)) == ""  # still 0.93 s before it: no


def _launched(export: Path, first: int, last: int) -> tuple[int, float]:
    """Computing (non-NCCL) kernels the program launched in steps first..last (by the CUDA call's
    time inside the NVTX `Step N Start` ranges) and their GPU time per step, plain sqlite3."""

    con = sqlite3.connect(export)
    try:
        span = tuple(independent.range_start(con, f"Step {n} Start") for n in (first, last + 1))
        n, d = con.execute(
            "SELECT count(*), sum(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
            "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId "
            "JOIN StringIds s ON s.id = k.shortName WHERE s.value NOT LIKE 'nccl%' AND r.start >= ? AND r.start < ?",
            span).fetchone()
        return n, d / 1e6 / (last - first + 1)
    finally:
        con.close()


def test_a_root_whose_kernels_are_no_longer_than_the_others_starts_its_gpu_work_late(runs) -> None:
    """The oom run's steps before the fault are healthy DDP: both ranks launch the same kernels
    (plain sqlite3: as many, their GPU time a step within 10 %), yet the critical path puts one
    rank's GPU last in most steps. That is no GPU computing more: the finding says its work
    starts late, with each rank's kernel time a step against the median rank's; and, as that
    rank's GPU waits between its kernels twice as long as the other's (plain sqlite3, steps 1-7,
    before the fault), that its kernel launches are slower."""
    run, rep, _ = runs["oom"]
    exports = {independent.export_rank(f): f for f in (run / "exports").glob("*.sqlite")}
    got = {r: _launched(f, 1, 10) for r, f in exports.items()}
    assert got[0][0] == got[1][0] and abs(got[0][1] - got[1][1]) < 0.1 * got[1][1], got
    gaps = {r: independent.small_gaps_ms(f, "Step 1 Start", "Step 8 Start") / 7 for r, f in exports.items()}
    slower = max(gaps, key=gaps.__getitem__)
    assert gaps[slower] > 1.5 * gaps[1 - slower], gaps
    found = [f for f in rep["findings"] if f["kind"] == "straggler"]
    assert [f["title"] for f in found] == [f"rank {slower} holds up rank(s) {1 - slower} (GPU work starting late: "
                                           "its kernel launches are slower)"]
    for f in found:
        (line,) = [e for e in f["evidence"] if "computing kernels take" in e]
        ms = float(line.split("computing kernels take ")[1].split(" ms")[0])
        assert abs(ms - got[f["ranks"][0]][1]) < 0.1 * ms, (line, got)
        assert f["fix"].startswith(f"Rank {f['ranks'][0]} launches the same kernels as the others, slower")


def _log(run: Path) -> str:
    """The job's own standard output (torchrun's, with every rank's prints)."""
    return "".join(p.read_text(errors="replace") for p in sorted((run / "submitit").glob("*_log.out")))


def _last_steps(run: Path) -> dict[int, int]:
    """Per rank the last `Step N Start` range its export holds (plain sqlite3)."""
    rows = independent.per_rank(run, "SELECT max(CAST(substr(coalesce(e.text, s.value), 6) AS INT)) FROM NVTX_EVENTS e "
                                     "LEFT JOIN StringIds s ON s.id = e.textId "
                                     "WHERE coalesce(e.text, s.value) LIKE 'Step % Start'")
    return {rk: r[0][0] for rk, r in rows.items()}


def test_a_cancel_of_a_running_job_says_no_rank_hung_and_every_rank_keeps_its_kernels(runs) -> None:
    """4x H200: a healthy job cancelled with `orch cancel` once rank 0 logged step 10. The stop
    caught the ranks one step apart (their last step ranges, plain sqlite3), as any stop of a
    running loop does: the ranks a step behind were moving, not hung, and the report says so
    instead of blaming them; every rank keeps its kernels up to the stop."""
    run, rep, _ = runs["cancel"]
    kernels = _kernels(run)
    assert sorted(kernels) == [0, 1, 2, 3] and all(n > 20_000 for n in kernels.values()), kernels
    assert _store_kernels(run) == kernels
    last = _last_steps(run)
    assert max(last.values()) - min(last.values()) == 1, last  # caught mid-loop, one step apart
    assert re.search(r"^step 30$", _log(run), re.M)  # the program was past step 30: it ran on
    o = rep["outcome"]
    assert (o["state"], o["scheduler_state"], o["behind"], o["gpu_lost"]) == ("cancelled", "CANCELLED", [], [])
    assert "no rank hung: the stop found the ranks at different points of a running loop" in o["line"], o["line"]
    top = rep["findings"][0]
    assert (top["kind"], top["title"]) == ("job_outcome", "the job was cancelled (CANCELLED)")


def test_a_rank_that_raises_is_named_with_its_error_and_the_step_its_capture_ends_in(runs) -> None:
    """2x H200: one rank's dataset raises on a corrupt sample in step 12 (inside a DataLoader
    worker); torchrun stops the other rank. The rank that raised is the one whose traceback the
    job's log tags; the top finding names it, its error and the step its capture ends in (its last
    `Step N Start` range, plain sqlite3), and both ranks keep their kernels."""
    run, rep, _ = runs["raise"]
    kernels = _kernels(run)
    assert sorted(kernels) == [0, 1] and all(n > 5_000 for n in kernels.values()), kernels
    assert _store_kernels(run) == kernels
    err = "".join(p.read_text(errors="replace") for p in (run / "submitit").glob("*_log.err"))
    (raised,) = {int(r) for r in re.findall(r"^\[rank(\d+)\]: ValueError: sample \d+: corrupt JPEG", err, re.M)}
    step = _last_steps(run)[raised]
    o = rep["outcome"]
    assert (o["state"], o["failed_first"], o["failed_step"]) == ("failed", raised, step)
    top = rep["findings"][0]
    assert (top["kind"], top["ranks"]) == ("job_outcome", [raised])
    assert top["title"].startswith(f"the job failed (FAILED): rank {raised} failed first (exit status 1): ValueError")
    assert top["fix"].startswith(f"Rank {raised} failed first (its capture ends in step {step}): its error is above")
