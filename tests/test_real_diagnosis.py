"""orch's diagnosis on real training code nobody here tuned for (tests/fixtures/real: the seed
tutorial's ResNet-50 DDP trainer with 2 and 0 DataLoader workers, a GPT-2 loop without NVTX that
logs `loss.item()`, a healthy GPU-bound run, torch.distributed.pipelining GPipe and 1F1B, and a
ViT DDP run whose rank 0 does metrics and evaluation between steps; 2x H200).

Every expected number comes from tests/oracle.py (plain sqlite3 over the same exports, no orch
code), computed here; the root causes are what the oracle's evidence shows (see the fixtures'
README), never orch's own output.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest

from orchestrator.analyze.build import build_report
from orchestrator.analyze.model_report import Report
from orchestrator.collect.collect import collect
from orchestrator.layout import Layout
from orchestrator.metrics.engine import Options
from tests import oracle
from tests.conftest import run_orch

pytestmark = pytest.mark.replay

REAL = Path(__file__).parent / "fixtures" / "real"
CAPTURES = ("resnet_nw2", "resnet_nw0", "item_sync", "healthy", "gpipe_m4", "1f1b_m8", "ddp_slowrank")
PIPELINES = {"gpipe_m4": 4, "1f1b_m8": 8}  # microbatches the scripts ran with


def _files(capture: str) -> list[Path]:
    return sorted(REAL.glob(f"{capture}_r*_*.sqlite.gz"))


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for c in CAPTURES:
        d = tmp_path_factory.mktemp(c)
        inp = d / "in"
        inp.mkdir()
        for f in _files(c):
            shutil.copy(f, inp / f.name)
        layout = Layout.parse("pp=2") if c in PIPELINES else Layout()
        out[c] = collect([inp], d / "run", layout=layout, workers=2).store
    return out


@pytest.fixture(scope="module")
def reports(stores: dict[str, Path]) -> dict[str, Report]:
    return {c: build_report(s, Options(microbatches=PIPELINES.get(c))) for c, s in stores.items()}


@pytest.fixture(scope="module")
def truth() -> dict[str, dict]:
    """The oracle, run now over the fixtures (JSON round trip: rank keys become strings)."""
    return json.loads(json.dumps(oracle.build_truth(str(REAL))))


def test_shipped_truth_is_what_the_oracle_computes(truth) -> None:
    assert truth == json.loads((REAL / "truth.json").read_text())


def _kinds(rep: Report, severities: tuple[str, ...] = ("high", "medium")) -> list[str]:
    return [f.kind for f in rep.findings if f.severity in severities]


@pytest.mark.parametrize("capture", CAPTURES)
def test_steps_found_as_the_code_marks_them(reports, truth, capture: str) -> None:
    """Steps from the tutorial's `Step N Start` (restarting each epoch), from `step N`, or, with no
    NVTX at all, inferred from the loop's own period; the step time is the iteration (start to
    next start), so the time between step ranges counts."""
    rep, t = reports[capture], truth[capture]
    inferred = t["ranks"]["0"]["steps_source"].startswith("kernel bursts")
    assert rep.window.step_source.startswith("inferred" if inferred else "numbered NVTX"), rep.window.step_source
    for r in rep.ranks:
        tr = t["ranks"][str(r.rank)]
        if not inferred:
            assert len(r.step_ms) == tr["steps_found"]
            assert r.median_step_ms == pytest.approx(tr["step_period_ms"]["median"], abs=0.01)
        else:
            assert abs(len(r.step_ms) - tr["steps_found"]) <= 2
            assert r.median_step_ms == pytest.approx(tr["step_period_ms"]["median"], rel=0.03)


@pytest.mark.parametrize("capture", ["resnet_nw2", "resnet_nw0"])
def test_tutorial_dataloader_starves_every_rank(reports, truth, capture: str) -> None:
    rep, t = reports[capture], truth[capture]
    assert t["verdict"]["root_cause_ranks"] == [0, 1]
    (stall,) = [f for f in rep.findings if f.kind == "data_loader_stall"]
    assert stall.ranks == [0, 1] and stall.severity == "high"
    for r in rep.ranks:
        between = r.gaps_by_range_ms.get("between steps (input pipeline)", 0.0)
        # The GPU idles between the step ranges (the oracle's time between ranges bounds it).
        assert between > 0.5 * sum(t["ranks"][str(r.rank)]["between_steps_each_ms"][1:])
        assert "(no NVTX range)" not in rep.findings[0].title
    text = " ".join(stall.evidence)
    if capture == "resnet_nw2":  # 2 workers: the main thread waits on the workers' queue
        assert "`sem_clockwait`" in text and "blocked waiting" in text
        (st,) = [f for f in rep.findings if f.kind == "straggler"]
        assert st.ranks == [1] and st.victims == [0] and "input pipeline" in st.title
    else:  # 0 workers: the main thread decodes the images itself
        assert "running on the CPU" in text


def test_the_tutorials_two_workers_are_counted_against_the_pace_they_set(stores, truth, tmp_path: Path) -> None:
    """resnet_nw2's ranks decode the same JPEGs with DataLoader(num_workers=2) (the workload's
    arguments, real/README.md): with the run's loader settings in the store, as `orch collect` of
    its run keeps them, the fix counts the workers that keep up. The independent count is the
    oracle's for rank 1, the rank nobody paces: its 2 workers deliver a batch every mean step
    period, so each takes 2 x that, and the step without its wait between the step ranges, without
    its exposed NCCL time and without nsys' own per-call cost (the count is for the job without
    the profiler: the oracle's CUDA calls in the window at the calibrated 7.6 us each, at most its
    GPU gaps under 1 ms, per step) needs ceil(2 x period / that) of them. Rank 0 loads the same
    batches: the same count, though its own step holds its wait for rank 1 (taken off as orch's
    exposed wait). The straggler finding on rank 1 names it too."""
    import duckdb

    from orchestrator.store.evidence import JobEvidence
    from orchestrator.store.loaders import LoaderSettings

    store = tmp_path / "profile.duckdb"
    shutil.copy(stores["resnet_nw2"], store)
    two = [LoaderSettings(num_workers=2, pin_memory=True, prefetch_factor=2, persistent_workers=False,
                          batch_size=64, dataset="ImageFolder")]
    ev = JobEvidence(job_id="1", executor="local", state="COMPLETED", loaders={0: two, 1: two})
    with duckdb.connect(str(store)) as con:
        con.execute("INSERT INTO meta VALUES ('job', ?)", [ev.model_dump_json()])
    rep = build_report(store, Options())
    (stall,) = [f for f in rep.findings if f.kind == "data_loader_stall"]
    (late,) = [f for f in rep.findings if f.kind == "straggler"]
    r1 = truth["resnet_nw2"]["ranks"]["1"]
    period, wait = r1["step_period_ms"]["mean"], r1["between_steps_ms"]["mean"]
    n = r1["step_period_ms"]["n"]
    nccl = r1["exposed_nccl_pct"] / 100 * r1["window_ms"] / n
    nsys = min(r1["cuda_calls_in_window"] * 0.0076, r1["gpu_gaps_lt_1ms"]["total_ms"]) / n
    need = -(-2 * period // (period - wait - nccl - nsys))
    (said,) = [w for w in stall.evidence if w.startswith("rank 1: its 2 DataLoader workers")]
    # one sentence for both ranks, the most either needs
    said_fix = "The 2 DataLoader workers of rank(s) 0-1 cannot keep up: DataLoader(num_workers="
    count = int(stall.fix.split(said_fix)[1].split(")")[0])
    assert abs(count - need) <= 1, (count, need, said)
    # the top finding, rank 1 late in its input, names the same count
    assert late.ranks == [1] and f"{said_fix}{count})" in late.fix
    assert "num_workers>0" not in stall.fix and "num_workers>0" not in late.fix


def test_critical_path_tiles_every_step(stores) -> None:
    """Every step's critical path is one rank's work after another, back to back from the step's
    first GPU work to its last (no gap, no overlap): checked in plain Python over the segments,
    on every capture with more than one step of communication."""
    from orchestrator.metrics.engine import analysis

    for capture in ("resnet_nw2", "ddp_slowrank", "gpipe_m4", "1f1b_m8"):
        con, _ = analysis(stores[capture], Options(microbatches=PIPELINES.get(capture)))
        try:
            steps = {st: (t0, t1) for st, t0, t1 in con.execute("SELECT step, t0, t1 FROM cp_steps").fetchall()}
            segs = con.execute("SELECT step, s, e FROM cp_segments WHERE e > s ORDER BY step, s").fetchall()
        finally:
            con.close()
        assert steps, capture
        for st, (t0, t1) in steps.items():
            mine = [(s, e) for x, s, e in segs if x == st]
            assert mine[0][0] == t0 and mine[-1][1] == t1, (capture, st)
            assert all(a[1] == b[0] for a, b in itertools.pairwise(mine)), (capture, st)


def test_workers_0_vs_2_diff_flags_step_time(stores, tmp_path: Path) -> None:
    for c in ("resnet_nw2", "resnet_nw0"):
        p = run_orch("report", str(stores[c]), "--json", str(tmp_path / f"{c}.json"))
        assert p.returncode == 0, p.stderr
    d = run_orch("diff", str(tmp_path / "resnet_nw2.json"), str(tmp_path / "resnet_nw0.json"),
                 "--json", str(tmp_path / "d.json"))
    assert d.returncode == 1, d.stdout + d.stderr
    regressed = {(r["rank"], r["metric"]) for r in json.loads((tmp_path / "d.json").read_text())["regressions"]}
    assert {(0, "median_step_ms"), (1, "median_step_ms")} <= regressed


def test_an_evaluation_every_4_steps_is_no_one_off(reports) -> None:
    """Rank 0 evaluates every 4 steps: plain sqlite3 over its export finds steps 4, 8 and 12 (from
    one `step N` start to the next) over 3x the median of steps 1-12, the loop's own pattern
    rather than a warm-up. So none of them is a one-off (oneoff_gaps), and the GPU idle between
    steps that cpu_gap costs on rank 0 holds theirs: at least the gaps of 1 ms or more that begin
    in them."""
    import sqlite3
    import statistics

    from orchestrator.api import open_store
    from tests.independent import long_gaps_ms, range_start
    from tests.oracle import decompressed

    rep = reports["ddp_slowrank"]
    (f,) = _files("ddp_slowrank")[:1]
    with decompressed(str(f)) as export:
        con = sqlite3.connect(export)
        try:
            starts = [range_start(con, f"step {i}") for i in range(14)]
        finally:
            con.close()
        ms = {i: (starts[i + 1] - starts[i]) / 1e6 for i in range(1, 13)}
        long = [i for i, v in ms.items() if v > 3 * statistics.median(ms.values())]
        assert long == [4, 8, 12], ms
        idle = sum(long_gaps_ms(Path(export), f"step {i}", f"step {i + 1}") for i in long)
    assert not [r for r in open_store(rep.store).view("oneoff_gaps").to_pylist() if r["rank"] == 0]
    (gap,) = [f for f in rep.findings if f.kind == "cpu_gap"]
    assert gap.ranks == [0] and "between steps (other work)" in gap.title, gap.title
    assert gap.cost_ms >= idle > 0.3 * gap.cost_ms, (gap.cost_ms, idle)


def test_item_sync_without_nvtx(reports, truth) -> None:
    """No NVTX: iterations inferred; the per-step `loss.item()` (cudaStreamSynchronize) is named
    with the GPU idle after the syncs; nothing dominant, so nothing high."""
    rep, t = reports["item_sync"], truth["item_sync"]
    (sync,) = [f for f in rep.findings if f.kind == "host_sync"]
    assert "cudaStreamSynchronize" in " ".join(sync.evidence)
    for r in rep.ranks:
        tr = t["ranks"][str(r.rank)]["syncs_in_window"]
        assert r.sync_per_step == pytest.approx(tr["per_step"], rel=0.1)
        assert r.sync_idle_ms_per_step == pytest.approx(tr["gpu_idle_after_ms_per_step"], rel=0.15)
    assert "high" not in {f.severity for f in rep.findings}


def test_healthy_run_is_healthy(reports, truth) -> None:
    rep, t = reports["healthy"], truth["healthy"]
    assert t["verdict"]["root_cause_ranks"] == []
    assert _kinds(rep) == [] and rep.findings[-1].kind == "healthy"
    for r in rep.ranks:
        assert 100 - r.gpu_idle_pct == pytest.approx(t["ranks"][str(r.rank)]["gpu_busy_pct"], abs=1.0)


@pytest.mark.parametrize("capture", list(PIPELINES))
def test_pipeline_stage_and_bubble(reports, truth, capture: str) -> None:
    """The heavier stage (LM head + loss on stage 1) is named; the bubble is time without a compute
    kernel (waiting send/recv counts) and is compared with (p-1)/(m+p-1)."""
    rep, t = reports[capture], truth[capture]
    b = t["bubble"]
    assert rep.findings[0].kind == "stage_imbalance" and rep.findings[0].ranks == [1]
    per = b["per_rank"]
    assert rep.imbalance.ratio == pytest.approx(per["1"]["compute_ms_per_step"] / per["0"]["compute_ms_per_step"],
                                                rel=0.03)
    stages = {s.stage: s for s in rep.stages}
    for r in ("0", "1"):
        assert stages[int(r)].bubble_pct == pytest.approx(per[r]["compute_idle_pct_own_step_span"], abs=6.0)
        assert stages[int(r)].theory_bubble_pct == pytest.approx(b["theory_pct"], abs=0.01)
    assert stages[0].bubble_pct > b["theory_pct"] + 10  # the light stage idles far above theory
    # Send/recv time is mostly waiting for the other stage, not transfer, and not "exposed comm".
    r0 = rep.rank(0)
    assert r0.p2p_wait_ms > 0.9 * r0.p2p_ms and "exposed_communication" not in _kinds(rep)


def test_rank_doing_work_between_steps_is_the_root(reports, truth) -> None:
    """Rank 0 computes metrics (`.cpu()`) after every step and evaluates every 4 steps, outside
    its step ranges; rank 1 waits in the next all-reduce. Not an input-pipeline problem."""
    rep, t = reports["ddp_slowrank"], truth["ddp_slowrank"]
    assert t["verdict"]["root_cause_ranks"] == [0]
    top = rep.findings[0]
    assert top.kind == "straggler" and top.ranks == [0] and top.victims == [1]
    assert "between steps (other work)" in top.title and "evaluation" in top.fix
    assert "data_loader_stall" not in _kinds(rep)
    caused = t["verdict"]["evidence"]["wait_caused_ms"]["0"]
    assert rep.rank(1).nccl_wait_ms >= caused  # the oracle counts skews >= 0.1 ms only
