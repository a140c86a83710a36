"""The replay of the job (61_replay.sql) on real multi-GPU captures whose truth is known without
orch (tests/fixtures/truth/, `python -m tests.truth`): the planted rank, and what fixing it saves
as the measured difference from the job's healthy twin. A DP2 x PP2 GPipe job whose stage-0 rank
1 sleeps in its data loading (rank 3, its pipeline's stage 1, waits for its activations: a
victim), two DDP jobs with one slow rank (input, and a sleep before each step), and the GPipe
job's healthy twin. The replay of the unchanged trace must reproduce the steps; the what-if that
puts the planted rank at its stage peers' pace must save what its twin measured (within 20 %),
and a rank that only waited nothing worth a finding. The job replayed without its planted cause
(the input on time, the stages evened, no host syncs) saves what its twin measured, or the GPU's
idle after the syncs; an even pipeline evened saves nothing."""

from __future__ import annotations

import gzip
import json
import lzma
import shutil
from pathlib import Path

import duckdb
import pytest

from orchestrator.analyze.build import build_report
from orchestrator.analyze.model_report import Report
from orchestrator.collect.collect import collect
from orchestrator.layout import Layout
from orchestrator.metrics.engine import Options, analysis
from orchestrator.report.diff import diff_reports
from orchestrator.report.html import render_html
from orchestrator.sqlmodules import SQL_DIR
from tests.stores import Stores

pytestmark = pytest.mark.replay

FIXTURES = Path(__file__).parent / "fixtures"
PLANTED = ["dp2pp2-gpipe-slow", "gpu_e2e-ddp", "h200-ddp_straggler"]
HEALTHY = ["dp2pp2-gpipe-ok"]


def _truth(case: str) -> dict:
    return json.loads((FIXTURES / "truth" / f"{case}.json").read_text())


def _report(exports: list[Path], layout: str | None, tmp: Path) -> Report:
    """orch's report of these compressed exports, decompressed into `tmp`, with this layout."""
    (tmp / "in").mkdir()
    for src in exports:
        opener = lzma.open if src.suffix == ".xz" else gzip.open
        with opener(src) as fi, open(tmp / "in" / src.stem, "wb") as fo:
            shutil.copyfileobj(fi, fo)
    return build_report(collect([tmp / "in"], tmp / "run", layout=Layout.parse(layout), workers=1).store, Options())


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Report]:
    out = {}
    for case in PLANTED + HEALTHY:
        spec = _truth(case)["input"]
        out[case] = _report([FIXTURES / n for n in spec["exports"]], spec.get("layout"), tmp_path_factory.mktemp(case))
    return out


@pytest.mark.parametrize("case", PLANTED + HEALTHY)
def test_the_unchanged_replay_reproduces_every_step(reports: dict[str, Report], case: str) -> None:
    rp = reports[case].replay
    assert rp is not None and rp.steps
    assert rp.error_pct < 5.0 and all(s.error_pct < 5.0 for s in rp.steps)
    assert rp.worst_step_pct == max(s.error_pct for s in rp.steps)


@pytest.mark.parametrize("case", PLANTED)
def test_the_planted_rank_saves_what_its_twin_measured_and_the_others_little(
        reports: dict[str, Report], case: str) -> None:
    truth, rp = _truth(case), reports[case].replay
    assert rp is not None
    top = rp.whatifs[0]
    assert [top.rank] == truth["root"]
    assert abs(top.saving_ms - truth["saving_ms"]) <= 0.2 * truth["saving_ms"], (top.saving_ms, truth["saving_ms"])
    others = [w for w in rp.whatifs[1:] if w.rank is not None]  # other ranks: the cause's own what-if saves it too
    assert all(w.saving_ms < 0.1 * top.saving_ms for w in others), [(w.what, w.saving_ms) for w in rp.whatifs]
    straggler = next(f for f in reports[case].findings if f.kind == "straggler")
    assert straggler.ranks == truth["root"] and straggler.cost_ms == top.saving_ms


@pytest.mark.parametrize("case", HEALTHY)
def test_a_healthy_job_has_no_what_if_worth_a_finding(reports: dict[str, Report], case: str) -> None:
    rp = reports[case].replay
    assert rp is not None and rp.whatifs
    assert all(w.saving_pct < 2.0 for w in rp.whatifs), [(w.what, w.saving_pct) for w in rp.whatifs]


def test_every_report_says_how_far_its_replay_is_from_the_trace(reports: dict[str, Report]) -> None:
    rep = reports["dp2pp2-gpipe-slow"]
    assert rep.replay is not None
    page = render_html(rep)
    assert 'id="replay"' in page and f"{rep.replay.error_pct:.2f} %" in page
    assert json.loads(rep.model_dump_json())["replay"]["error_pct"] == rep.replay.error_pct
    twin = reports["dp2pp2-gpipe-ok"]
    row = next(r for r in diff_reports(twin, rep)["rows"] if r["metric"] == "replay error %")
    assert (row["a"], row["b"]) == (twin.replay.error_pct, rep.replay.error_pct)
    # the terminal's diff keeps only rows that moved: each run's replay is a line of its own
    assert diff_reports(twin, twin)["replay"] == [f"A: {twin.replay.line}", f"B: {twin.replay.line}"]
    assert f"{twin.replay.error_pct:.2f} %" in twin.replay.line


# The real captures where a rank's what-if is left unreplayed: a 2-rank job whose other rank
# never arrived alone last at a synchronisation nor ended a step alone last.
UNREPLAYED = ["gpu_e2e-ddp", "h200-ddp_straggler", "real-item_sync"]


@pytest.mark.parametrize("case", UNREPLAYED)
def test_a_rank_that_held_nobody_up_saves_what_replaying_it_would_within_the_replays_error(
        stores: Stores, case: str) -> None:
    """Its what-if saves 0 unreplayed; replayed after all (every scenario forced back into the
    replay's rounds), it saves no more than the replay's error."""
    con, _ = analysis(stores.report(case)[0] / "profile.duckdb", Options())
    try:
        skipped = [r[0] for r in con.execute("SELECT scn FROM replay_scenarios WHERE NOT replayed").fetchall()]
        assert skipped, "every rank was replayed"
        saved = dict(con.execute("SELECT scn, saving_ns FROM replay_whatif").fetchall())
        assert [saved[s] for s in skipped] == [0] * len(skipped)
        (error_ns,) = con.execute("SELECT error_ns FROM replay_error").fetchone()
        rounds = [st.query for st in duckdb.extract_statements((SQL_DIR / "61_replay.sql").read_text())]
        first = next(i for i, q in enumerate(rounds) if "TABLE replay_scenarios AS" in q)
        for q in rounds[:first]:  # the file's private helpers again: the analysis dropped them once it ran
            con.execute(q)
        con.execute("UPDATE replay_scenarios SET replayed = true")
        for q in rounds[first + 1:]:
            con.execute(q)
        replayed = dict(con.execute("SELECT scn, saving_ns FROM replay_whatif").fetchall())
        assert all(0 <= replayed[s] <= error_ns for s in skipped), ([replayed[s] for s in skipped], error_ns)
    finally:
        con.close()


# What removing each planted cause saves, against its twin's measured difference (truth files:
# plain sqlite3 over both runs' step ranges): the input on time, the stages evened. Every
# multi-rank capture with such a truth (one GPU has no synchronisation to replay), but the
# scoreboard's known misses (tests/scoreboard_known.json, each with its reason: a root that was
# not profiled, the 4+8 split's balancing short of its twin).
CAUSE_REMOVED = {"input": "input on time", "stage": "stages balanced"}
KNOWN = json.loads((Path(__file__).parent / "scoreboard_known.json").read_text())
REMOVED = sorted(t["case"] for t in map(json.loads, (p.read_text() for p in (FIXTURES / "truth").glob("*.json")))
                 if t["cause"] in CAUSE_REMOVED and t.get("saving_ms") and t["case"] not in KNOWN
                 and ("run" in t["input"] or len(t["input"]["exports"]) > 1))  # one GPU: nothing to replay


@pytest.mark.parametrize("case", REMOVED)
def test_the_job_replayed_without_its_cause_saves_what_its_twin_measured(stores: Stores, case: str) -> None:
    truth, rep = _truth(case), stores.report(case)[1]
    (w,) = [w for w in rep["replay"]["whatifs"] if w["what"] == CAUSE_REMOVED[truth["cause"]]]
    assert abs(w["saving_ms"] - truth["saving_ms"]) <= 0.2 * truth["saving_ms"], (w, truth["saving_ms"])


@pytest.mark.parametrize("case", ["pairs-pp-even", "pairs-pp-even-h200", "pairs-pp4-even"])
def test_an_even_pipeline_replayed_with_its_stages_balanced_saves_nothing(stores: Stores, case: str) -> None:
    """The 6+6 splits: evening the stages saves under 1 % of the steps (the bubble they wait is
    the schedule's own with their transfers), so no bubble finding claims a saving."""
    rep = stores.report(case)[1]
    (w,) = [w for w in rep["replay"]["whatifs"] if w["what"] == "stages balanced"]
    assert w["saving_pct"] < 1.0, w
    assert all(f["severity"] == "info" and f["cost_ms"] <= max(w["saving_ms"], 0.0)
               for f in rep["findings"] if f["kind"] == "pipeline_bubble"), rep["findings"]


def test_the_job_replayed_without_host_syncs_saves_the_gpu_idle_after_them(stores: Stores) -> None:
    """GPT-2 DDP printing loss.item() every step: without its syncs the steps save what the GPU
    idled after them (plain sqlite3 in tests/fixtures/real/truth.json: from each sync's return to
    the GPU's next kernel, per step, the larger rank's), within 20 %, and the host-sync finding
    costs that."""
    rep = stores.report("real-item_sync")[1]
    truth = json.loads((FIXTURES / "real" / "truth.json").read_text())["item_sync"]["ranks"]
    idle = max(r["syncs_in_window"]["gpu_idle_after_ms_per_step"] for r in truth.values())
    (w,) = [w for w in rep["replay"]["whatifs"] if w["what"] == "no host syncs"]
    assert abs(w["saving_ms"] / w["steps"] - idle) <= 0.2 * idle, (w, idle)
    (f,) = [f for f in rep["findings"] if f["kind"] == "host_sync"]
    assert f["cost_ms"] == w["saving_ms"]


# Jobs profiled whole, analysed with two ranks' exports left out, as `profile.ranks` choosing one
# rank per stage would leave them (DP2 x PP2: stage = rank // 2): the rank not profiled that the
# profiled ones wait for in their collectives, and the whole capture's what-if for that rank (its
# own work at its stage peer's pace), which saw its work.
SUBSETS = [("pp4-slow-loader", (0, 2)), ("pp4-uneven", (0, 2)), ("pp4-uneven", (1, 3)), ("pp4-even", (1, 3))]


def _profiled_only(pair: str, kept: tuple[int, ...], tmp: Path) -> Report:
    """The report of pairs/`pair` with only the exports of ranks `kept`, its layout known."""
    exports = [src for src in sorted((FIXTURES / "pairs" / pair / "exports").glob("*.sqlite.gz"))
               if int(src.name.split("_r")[1].split("_")[0]) in kept]
    return _report(exports, "pp=2,dp=2,microbatches=4", tmp)


@pytest.mark.parametrize(("pair", "kept"), SUBSETS)
def test_a_rank_left_out_is_named_with_what_the_whole_capture_replays_it_saving(
        stores: Stores, tmp_path: Path, pair: str, kept: tuple[int, ...]) -> None:
    whole = stores.report(f"pairs-{pair}")[1]
    rep = _profiled_only(pair, kept, tmp_path)
    (f,) = [f for f in rep.findings if f.kind == "unprofiled_straggler"]
    # the rank left out that the whole capture's replay finds most costly
    ref = max((w for w in whole["replay"]["whatifs"] if w["rank"] is not None and w["rank"] not in kept),
              key=lambda w: w["saving_ms"])
    assert f.ranks == [ref["rank"]] and f.severity != "info", (f.ranks, f.severity, ref)
    assert abs(f.cost_ms - ref["saving_ms"]) <= 0.2 * ref["saving_ms"], (f.cost_ms, ref)
    assert set(f.victims) <= set(kept)


def test_a_late_rank_that_was_profiled_is_not_looked_for_among_the_others(tmp_path: Path) -> None:
    """The slow loader's rank 1 profiled with rank 3 (its pipeline peer): its own data-loading
    stall is found, and no rank left out is blamed for what rank 1 made them wait."""
    rep = _profiled_only("pp4-slow-loader", (1, 3), tmp_path)
    assert rep.findings[0].kind == "data_loader_stall" and rep.findings[0].ranks == [1]
    assert all(f.severity == "info" for f in rep.findings if f.kind == "unprofiled_straggler")
