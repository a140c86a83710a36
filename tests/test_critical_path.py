"""The cross-rank critical path (57_wait_graph.sql, 59_critical_path.sql, rules/straggler.py) on
real H200 exports, and on copies of them in which one rank's work is delayed at a chosen point
(tests/plant.py: plain sqlite3 UPDATEs, so the trace stays real), plus a real gloo job on this
CPU. Expected values come from the plant itself (who, what, how long) and from plain formulas,
never from orch.
"""

from __future__ import annotations

import gzip
import itertools
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from orchestrator.analyze.build import build_report
from orchestrator.analyze.model_report import Report
from orchestrator.collect.collect import collect, collect_parts
from orchestrator.layout import Layout
from orchestrator.metrics.engine import Options, analysis
from tests.plant import LABEL, _shift, _step_range, plant
from tests.test_parts import assert_same_report

pytestmark = [pytest.mark.jobs, pytest.mark.nsys]

HERE = Path(__file__).parent / "fixtures"
MS = 1_000_000


def _unzip(capture: Path, pattern: str, dest: Path) -> dict[int, Path]:
    dest.mkdir(parents=True)
    out = {}
    for f in sorted(capture.glob(pattern)):
        rank = int(f.name.split("_r")[-1].split("_")[0])
        out[rank] = dest / f.name.removesuffix(".gz")
        with gzip.open(f) as src, open(out[rank], "wb") as dst:
            shutil.copyfileobj(src, dst)
    return out


def _report(files: dict[int, Path], run: Path, layout: str, m: int | None) -> tuple[Report, Path]:
    inp = next(iter(files.values())).parent
    store = collect([inp], run, layout=Layout.parse(layout) if layout else Layout(), workers=1).store
    return build_report(store, Options(microbatches=m)), store


def _straggler(rep: Report):
    return [f for f in rep.findings if f.kind == "straggler"]


CASES = {  # name: (fixture dir, glob, layout, microbatches, kernel name LIKE, delayed ranks, steps)
    "first_stage": ("real", "gpipe_m4_r*.sqlite.gz", "pp=2", 4, "ncclDevKernel_SendRecv", [0], [3, 5, 7, 9]),
    "last_stage": ("real", "gpipe_m4_r*.sqlite.gz", "pp=2", 4, "ncclDevKernel_SendRecv", [1], [3, 5, 7, 9]),
    "dp_peer": ("gpu_e2e", "ok_r*.sqlite.gz", "", None, "ncclDevKernel_AllReduce%", [0], [2, 4, 6]),
    "every_rank": ("gpu_e2e", "ok_r*.sqlite.gz", "", None, "ncclDevKernel_AllReduce%", [0, 1], [2, 4, 6]),
}
D_NS = 80 * MS


@pytest.fixture(scope="module", params=sorted(CASES))
def planted(request, tmp_path_factory: pytest.TempPathFactory):
    fx, pattern, layout, m, like, delayed, steps = CASES[request.param]
    d = tmp_path_factory.mktemp(request.param)
    files = _unzip(HERE / fx, pattern, d / "in")
    plant(files, delayed, steps, D_NS, like)
    rep, store = _report(files, d / "run", layout, m)
    return request.param, rep, store, delayed, steps, sorted(files)


def test_planted_root_named_first_with_its_phase(planted) -> None:
    _, rep, _, delayed, steps, ranks = planted
    found = _straggler(rep)
    if len(delayed) == len(ranks):  # every rank paused alike: nobody waited, no root; a shared cause
        assert found == [], [f.title for f in found]
        assert rep.findings[0].ranks == ranks and f"`{LABEL}`" in rep.findings[0].title
        return
    (root,) = delayed
    assert found, [f.title for f in rep.findings]
    top = rep.findings[0]  # the top finding (straggler, or the GPU idle it causes) names the root and range
    assert top.ranks == [root] and f"`{LABEL}`" in top.title, top.title
    f = found[0]
    assert f.ranks == [root] and f"`{LABEL}`" in f.title, f.title
    assert f.victims == [r for r in ranks if r != root]
    # Each planted step puts D on the critical path, once.
    assert f.cost_ms == pytest.approx(len(steps) * D_NS / MS, rel=0.1)
    assert not any(v in g.ranks for g in found for v in f.victims), "a victim blamed as a root"


def test_per_step_roots_are_the_planted_steps(planted) -> None:
    _, _, store, delayed, steps, ranks = planted
    con, _ = analysis(store, Options())
    try:
        roots = con.execute("SELECT step, rank, phase, victims FROM cp_roots ORDER BY step").fetchall()
    finally:
        con.close()
    planted_steps = [r for r in roots if r[0] in steps]
    if len(delayed) == len(ranks):
        assert planted_steps == []
        return
    assert [(r[0], r[1], r[2], r[3]) for r in planted_steps] == [
        (s, delayed[0], LABEL, [x for x in ranks if x != delayed[0]]) for s in steps]


def test_who_held_the_steps_up_is_counted_once_in_the_analysis(planted) -> None:
    """The summaries the terminal and `orch diff` print (the path's composition in %, each root's
    steps and excess) come with the report, and agree with its own per-step rows."""
    _, rep, _, delayed, steps, ranks = planted
    cp = rep.critical_path
    assert sum(cp.composition_pct.values()) == pytest.approx(100.0, abs=0.1)
    # The largest part first, in both maps: the JSON of one store is the same text every time.
    parts = list(cp.composition_ms.values())
    assert parts == sorted(parts, reverse=True) and list(cp.composition_pct) == list(cp.composition_ms)
    held = {h.rank: h for h in cp.held_by}
    per_step = {}
    for s in cp.steps:
        if s.root is not None:
            per_step.setdefault(s.root, []).append(s.root_ms)
    assert set(held) == set(per_step)
    for rk, ms in per_step.items():
        assert held[rk].steps == len(ms)
        assert held[rk].ms_per_held_step == pytest.approx(sum(ms) / len(ms), abs=0.01)
        assert held[rk].total_ms == pytest.approx(sum(ms), abs=0.01)
        assert held[rk].ms_per_step * len(cp.steps) == pytest.approx(held[rk].total_ms, abs=0.01)
    if len(delayed) < len(ranks):  # one rank paused: it holds up at least the planted steps
        assert cp.held_by[0].rank == delayed[0] and cp.held_by[0].steps >= len(steps)


def test_terminal_names_the_root_of_the_planted_steps(planted) -> None:
    """The terminal's critical-path lines: the planted rank holds up the planted steps (and only
    those are listed as held up most, each with about D put on the path, in the planted range).
    Unplanted steps may have a small root of their own: only the planted ones are checked."""
    from orchestrator.report.critical_terminal import MAX_STEPS, critical_lines

    _, rep, _, delayed, steps, ranks = planted
    lines = critical_lines(rep)
    assert lines[0].startswith(f"critical path over {len(rep.critical_path.steps)} step(s): ")
    if len(delayed) == len(ranks):  # every rank paused alike: the planted steps have no root
        assert not any(re.match(rf"  step {st}: ", line) for st in steps for line in lines), lines
        return
    (root,) = delayed
    held = re.match(rf"  held up by rank {root} in (\d+)/{len(rep.critical_path.steps)} step\(s\), ", lines[1])
    assert held and int(held.group(1)) >= len(steps), lines[1]  # first: it put the most on the paths
    listed = lines[2:]
    assert len(listed) == min(MAX_STEPS, len(steps))
    for line in listed:
        step, put = re.fullmatch(r"  step (\d+): [\d.]+ ms; rank \d+ put ([\d.]+) ms .*", line).groups()
        assert int(step) in steps and f"rank {root} put" in line and f" in {LABEL};" in line, line
        assert float(put) == pytest.approx(D_NS / MS, rel=0.15)


@pytest.mark.parametrize("fx,pattern,layout,m", [
    ("real", "gpipe_m4_r*.sqlite.gz", "pp=2", 4),
    ("real", "healthy_r*.sqlite.gz", "", None),
    ("gpu_e2e", "ok_r*.sqlite.gz", "", None),
])
def test_nothing_planted_no_root(tmp_path: Path, fx: str, pattern: str, layout: str, m: int | None) -> None:
    files = _unzip(HERE / fx, pattern, tmp_path / "in")
    rep, _ = _report(files, tmp_path / "run", layout, m)
    assert _straggler(rep) == [], [f.title for f in _straggler(rep)]


@pytest.fixture(scope="module")
def gpipe_plain(tmp_path_factory: pytest.TempPathFactory) -> Report:
    d = tmp_path_factory.mktemp("gpipe_plain")
    return _report(_unzip(HERE / "real", "gpipe_m4_r*.sqlite.gz", d / "in"), d / "run", "pp=2", 4)[0]


def test_bubble_splits_theory_and_excess(planted, gpipe_plain: Report) -> None:
    """Theory is (p-1)/(m+p-1) for p = 2 stages and m = 4 microbatches; each planted pause adds D
    of no-compute time to both stages (one pauses, the other waits in send/recv) and D to the
    window: bubble' = (b W + n D) / (W + n D) from the unplanted run's b and W."""
    name, rep, _, delayed, steps, _ = planted
    if not name.endswith("stage"):
        return
    p, m = 2, 4
    plain = {s.stage: s for s in gpipe_plain.stages}
    win = {r.rank: r.window_ms for r in gpipe_plain.ranks}
    add = len(steps) * D_NS / MS
    for s in rep.stages:
        assert s.theory_bubble_pct == round(100 * (p - 1) / (m + p - 1), 2) == 20.0
        assert s.excess_bubble_pct == pytest.approx(s.bubble_pct - 20.0, abs=0.011)
        (rk,) = s.ranks
        b, w = plain[s.stage].bubble_pct / 100, win[rk]
        assert s.bubble_pct == pytest.approx(100 * (b * w + add) / (w + add), abs=1.0), (s.stage, delayed)


GLOO = '''
import os, time, torch, nvtx
import torch.distributed as dist
rank = int(os.environ["RANK"])
dist.init_process_group("gloo", init_method="file://" + os.environ["STORE"], rank=rank, world_size=2)
torch.manual_seed(0)
torch.set_num_threads(1)
net = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(4)]))
opt = torch.optim.SGD(net.parameters(), lr=1e-4)
x = torch.randn(256, 512)
for step in range(10):
    with nvtx.annotate(f"step {step}"):
        with nvtx.annotate("data_load"):
            time.sleep(0.005)
        with nvtx.annotate("forward"):
            loss = net(x).square().mean()
        if rank == int(os.environ["EXTRA"]) and step >= 2:
            with nvtx.annotate("extra_eval"):
                time.sleep(0.08)
        with nvtx.annotate("backward"):
            loss.backward()
        with nvtx.annotate("optimizer"):
            opt.step()
            opt.zero_grad()
dist.barrier()
os._exit(0)  # gloo's threads can abort a normal interpreter exit ("terminate called ...")
'''


@pytest.fixture(scope="module")
def gloo_report(tmp_path_factory: pytest.TempPathFactory, nsys: str) -> Report:
    """A real 2-rank gloo DDP job on this CPU, each rank under its own nsys; one rank runs an
    extra 80 ms range of its own before its backward (whose all-reduce the other waits in)."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from tests.conftest import capture_cpu

    d = tmp_path_factory.mktemp("gloo")
    (d / "in").mkdir()
    env = {"STORE": str(d / "store"), "EXTRA": "1"}
    with ThreadPoolExecutor(2) as ex:
        futs = []
        for r in (0, 1):
            futs.append(ex.submit(capture_cpu, nsys, GLOO, d / "in" / f"gloo_r{r}_h.{r}", env={**env, "RANK": str(r)}))
            time.sleep(2)  # two nsys starting in the same instant can fail ("Agent launcher failed")
        for f in futs:
            f.result()
    return build_report(collect([d / "in"], d / "run", layout=Layout(), workers=2).store, Options())


def test_gloo_blames_the_rank_with_its_own_range(gloo_report: Report) -> None:
    """No kernels to time: the waiting hides in the other rank's `backward`. The range only the
    slow rank has is the cause; the waiter is a victim, and the phase table flags that range."""
    top = [f for f in gloo_report.findings if f.severity in ("high", "medium")]
    assert top and top[0].ranks == [1] and "`extra_eval`" in top[0].title, [f.title for f in gloo_report.findings]
    assert top[0].victims == [0]
    assert not any(f.ranks == [0] for f in top), "the waiting rank blamed"
    rows = {(p.rank, p.range): p for p in gloo_report.tables.phases}
    assert rows[(1, "extra_eval")].cpu_outlier


def test_timeline_draws_the_critical_path(planted) -> None:
    """The HTML timeline of the slowest step (a planted one) shows the path: a bar under the
    delayed rank's lane that carries the excess (~D), and an arrow from it to each waiter; the
    bars of a step tile it (each moment of the step is on one rank's bar)."""
    import re

    from orchestrator.analyze.build import build_analysis
    from orchestrator.report.html import render_html

    name, _, store, delayed, _, ranks = planted
    if len(delayed) == len(ranks):
        return
    rep, ex = build_analysis(store, Options(microbatches=CASES[name][3]))
    html = render_html(rep, ex)
    svgs = re.findall(r'<svg id="timeline-\d+".*?</svg>', html, re.S)
    assert len(svgs) == 2  # the representative (median) step and the slowest
    slow = svgs[-1]
    bars = [(int(r), float(s), float(e)) for r, s, e in
            re.findall(r'<rect class="cp" data-rank="(\d+)" data-s="([\d.]+)" data-e="([\d.]+)"', slow)]
    assert bars and all(a[2] == pytest.approx(b[1], abs=1e-3) for a, b in itertools.pairwise(bars))
    (root,) = delayed
    heavy = [b for b in bars if b[0] == root and b[2] - b[1] >= D_NS / MS]
    assert heavy, bars
    for v in (r for r in ranks if r != root):
        assert re.search(f'<g class="path" data-root="{root}" data-victim="{v}">', slow)


def test_diff_names_the_new_root_and_the_bubble(planted, gpipe_plain: Report) -> None:
    """`orch diff` of the plain pipeline run against the planted one: the delayed rank appears as
    a root with about n D / steps ms per step, and each stage's bubble grows (regressions)."""
    from orchestrator.report.diff import diff_reports

    name, rep, _, delayed, steps, _ = planted
    if not name.endswith("stage"):
        return
    d = diff_reports(gpipe_plain, rep)
    rows = {r["metric"]: r for r in d["rows"]}
    (root,) = delayed
    r = rows[f"critical-path root rank {root}: excess ms/step"]
    n_steps = len(rep.critical_path.steps)
    assert r["a"] == 0 and r["b"] == pytest.approx(len(steps) * D_NS / MS / n_steps, rel=0.1) and r["regressed"]
    assert all(rows[f"bubble stage {s} %"]["regressed"] for s in (0, 1))
    assert rows["bubble stage 1 above theory %"]["delta"] == pytest.approx(rows["bubble stage 1 %"]["delta"], abs=0.02)
    assert not any(m.startswith("critical-path root rank") and x["regressed"] for m, x in rows.items()
                   if m != f"critical-path root rank {root}: excess ms/step")


def test_layout_cp_ep_vpp_groups_ranks() -> None:
    """--layout takes cp, ep and vpp: Megatron order tp, cp, dp, pp (rank = t + tp (c + cp (d + dp p))),
    the data-parallel index is the place in the stage's dp*cp group; ep and vpp add no ranks."""
    from orchestrator.errors import OrchError

    tp, cp, dp, pp = 2, 2, 2, 2
    lay = Layout.parse("tp=2,cp=2,pp=2,dp=2,ep=2,vpp=2")
    assert lay.world_size == tp * cp * dp * pp == 16 and lay.stage_size == 8
    for p in range(pp):
        for d in range(dp):
            for c in range(cp):
                for t in range(tp):
                    place = lay.place(t + tp * (c + cp * (d + dp * p)))
                    assert (place["stage"], place["dp_index"], place["tp_index"]) == (p, c + cp * d, t)
    assert Layout.parse("tp=2,cp=2,pp=2").resolve(16, source="--layout").dp == 2
    for bad, why in (("pp=1,vpp=2", "needs a pipeline"), ("dp=3,ep=2", r"must divide dp\*cp"),
                     ("pp=2,sp=2", "each of tp, pp, dp, cp, ep, vpp"),
                     ("microbatches=4", "microbatches=4 needs a pipeline")):
        with pytest.raises(OrchError, match=why):
            Layout.parse(bad)


def test_vpp_theory_and_what_is_not_analysed(tmp_path: Path) -> None:
    """With vpp the theory is (p-1)/(v m + p-1); the report says what cp, ep and vpp leave out."""
    files = _unzip(HERE / "real", "gpipe_m4_r*.sqlite.gz", tmp_path / "in")
    rep, _ = _report(files, tmp_path / "run", "pp=2,vpp=2,ep=1", 4)
    p, m, v = 2, 4, 2
    assert {s.theory_bubble_pct for s in rep.stages} == {round(100 * (p - 1) / (v * m + p - 1), 2)}
    assert any(n.startswith("layout vpp=2: ") for n in rep.notes) and not any("layout ep=" in n for n in rep.notes)


def test_the_layouts_microbatches_split_the_bubble_without_a_flag(tmp_path: Path) -> None:
    """A job orch submitted carries its schedule in the spec (layout: {pp: 2, microbatches: 4}):
    the bubble splits into theory and excess as with `--microbatches 4`, (p-1)/(m+p-1) = 20 %."""
    from orchestrator.spec.model import JobSpec

    lay = JobSpec.model_validate({"name": "pp", "launch": {"script": "t.py"},
                                  "layout": {"pp": 2, "microbatches": 4}}).layout
    assert (lay.pp, lay.microbatches) == (2, 4)
    files = _unzip(HERE / "real", "gpipe_m4_r*.sqlite.gz", tmp_path / "in")
    store = collect([next(iter(files.values())).parent], tmp_path / "run", layout=lay, workers=1).store
    rep = build_report(store, Options())
    assert {(s.microbatches, s.theory_bubble_pct) for s in rep.stages} == {(4, round(100 * (2 - 1) / (4 + 2 - 1), 2))}
    assert not any("microbatch count unknown" in e for f in rep.findings for e in f.evidence)
    for bad in ({"microbatches": 4}, {"pp": 1, "vpp": 2}):
        with pytest.raises(ValueError, match="needs a pipeline"):
            JobSpec.model_validate({"name": "pp", "launch": {"script": "t.py"}, "layout": bad})


def _as_rank(src: Path, dest: Path, rank: int, world: int) -> Path:
    """A copy of a real export that says it is `rank` of `world` (the launcher's environment)."""
    shutil.copy(src, dest)
    con = sqlite3.connect(dest)
    con.execute("UPDATE META_DATA_CAPTURE SET value = ? WHERE value LIKE 'RANK=%'", (f'RANK="{rank}"',))
    con.execute("UPDATE META_DATA_CAPTURE SET value = ? WHERE value LIKE 'LOCAL_RANK=%'", (f'LOCAL_RANK="{rank}"',))
    con.execute("UPDATE META_DATA_CAPTURE SET value = ? WHERE value LIKE 'WORLD_SIZE=%'", (f'WORLD_SIZE="{world}"',))
    con.commit()
    con.close()
    return dest


@pytest.fixture(scope="module")
def dp_pp(tmp_path_factory: pytest.TempPathFactory) -> tuple[Report, list[int]]:
    """DP2 x PP2 from the real 2-stage GPipe capture: its two ranks are pipeline 0 (ranks 0, 2 in
    Megatron order: stage = rank // 2) and copies of them pipeline 1 (ranks 1, 3). Stage 0 of
    pipeline 1 (rank 1) pauses before its first send/recv of EVERY analysed step: only its own
    pipeline peer waits; the data-parallel peers' same waits are the baseline."""
    d = tmp_path_factory.mktemp("dp_pp")
    src = _unzip(HERE / "real", "gpipe_m4_r*.sqlite.gz", d / "src")
    (d / "in").mkdir()
    files = {r: _as_rank(src[stage], d / "in" / f"gpipe_m4_r{r}_vm.{900 + r}.sqlite", r, 4)
             for r, stage in ((0, 0), (1, 0), (2, 1), (3, 1))}
    steps = list(range(1, 11))
    plant({1: files[1], 3: files[3]}, [1], steps, D_NS, "ncclDevKernel_SendRecv")
    # The capture has no per-step data-parallel all-reduce: pipeline 0 would drift ahead. As a
    # gradient sync would, it waits for pipeline 1 before each next step (idle, no kernel).
    for r in (0, 2):
        con = sqlite3.connect(files[r])
        for k in steps:
            _shift(con, _step_range(con, k + 1)[0], D_NS)
        con.commit()
        con.close()
    return _report(files, d / "run", "dp=2,pp=2", 4)[0], steps


def test_dp_pp_every_step_blames_the_stage0_rank_not_its_victim(dp_pp) -> None:
    rep, steps = dp_pp
    f = _straggler(rep)[0]
    assert f.ranks == [1] and f"`{LABEL}`" in f.title and f.victims == [3], (f.title, f.victims)
    # The copies hold no kernel that links the two pipelines (pipeline 0's wait for pipeline 1 is
    # a gap in its trace, not an all-reduce): the replay keeps that gap, so it prices no more than
    # the plant, and the finding costs what the replay says.
    what_if = rep.replay.saving(1) if rep.replay else None
    assert what_if is not None and f.cost_ms == what_if.saving_ms
    assert 0 <= f.cost_ms <= len(steps) * D_NS / MS * 1.1
    roots = {s.step: (s.root, s.root_phase, s.victims) for s in rep.critical_path.steps}
    assert all(roots[s] == (1, LABEL, [3]) for s in steps), roots


@pytest.mark.parametrize("capture", ["resnet_nw0", "resnet_nw2"])
def test_shared_input_stall_ranks_above_the_relative_straggler(tmp_path: Path, capture: str) -> None:
    """Every rank starves on its input (truth.json: the root cause is on both ranks). The shared
    cause comes first; a rank that is only worse at it is a medium straggler below it, and ranks
    that take turns are one finding, not two that blame each other."""
    import json

    truth = json.loads((HERE / "real" / "truth.json").read_text())[capture]["verdict"]
    assert truth["root_cause_ranks"] == [0, 1] and "input pipeline" in truth["root_cause"]
    rep, _ = _report(_unzip(HERE / "real", f"{capture}_r*.sqlite.gz", tmp_path / "in"), tmp_path / "run", "", None)
    assert rep.findings[0].kind == "data_loader_stall" and rep.findings[0].ranks == [0, 1]
    found = _straggler(rep)
    assert len(found) <= 1 and all(f.severity != "high" for f in found)
    assert all(any(e.startswith("every rank idles in `between steps (input pipeline)`") for e in f.evidence)
               for f in found)


def test_ranks_that_tie_are_one_wait_and_the_report_does_not_depend_on_row_order(tmp_path: Path) -> None:
    """Exact copies of a rank start every collective at the same nanosecond: the group's last
    starter is then several ranks. Each rank's part in an instance is still one node of the wait
    graph (not one per tied rank: 128 copies once made every node 128), and ties go to the
    lowest rank, so the report is the same whichever order the store hands the rows out in (here
    the in-process store, and the parts route's views, which read the files in another order)."""
    files = _unzip(HERE / "gpu_e2e", "ddp_r*.sqlite.gz", tmp_path / "src")
    inp = tmp_path / "in"
    inp.mkdir()
    n = 6
    for k in range(n):  # rank k is a copy of the job's rank k % 2, under rank k's own name
        shutil.copy(files[k % 2], inp / f"ddp_r{k}_vm.{1000 + k}.sqlite")
    a = collect([inp], tmp_path / "a", layout=Layout(), workers=2)
    b = collect_parts([inp], tmp_path / "b", layout=Layout(), workers=2, view_min_rows=0)
    assert b.views and a.ok_ranks == b.ok_ranks == list(range(n))
    assert_same_report(a.store, b.store)
    con, _ = analysis(a.store, Options())
    try:
        nodes, distinct, coll, instances, tied = con.execute(
            "SELECT (SELECT count(*) FROM wait_nodes WHERE kind = 'collective'),"
            " (SELECT count(DISTINCT (rank, s)) FROM wait_nodes WHERE kind = 'collective'),"
            " (SELECT count(*) FROM coll c SEMI JOIN gpu_ops o ON o.rank = c.rank AND o.start = c.start"
            "      AND o.name = c.name AND o.step IS NOT NULL),"
            " (SELECT count(DISTINCT (grp, name, kth)) FROM coll),"
            " (SELECT min(k) FROM (SELECT count(*) AS k FROM coll WHERE is_last GROUP BY grp, name, kth))"
        ).fetchone()
        waited_for = {r[0] for r in con.execute("SELECT DISTINCT waited_for FROM wait_edges").fetchall()}
        # the timeline's waits: one per rank and collective too; each wait is caused once
        waits, distinct_waits = con.execute("SELECT count(*), count(DISTINCT (rank, s)) FROM nccl_waits "
                                            "WHERE kind = 'collective'").fetchone()
        caused, waited = con.execute("SELECT (SELECT sum(wait_caused_ns) FROM coll_rank), "
                                     "(SELECT sum(wait_ns) FROM coll)").fetchone()
    finally:
        con.close()
    assert tied == n // 2 and instances > 0  # every instance's last starter is three copies
    assert nodes == distinct == coll
    assert waited_for <= {0, 1}  # the lowest of the tied copies
    assert waits == distinct_waits > 0 and caused == waited > 0
    rep = build_report(a.store, Options())
    assert {s.root for s in rep.critical_path.steps if s.root is not None} <= {0, 1}
