"""Each rule on small synthetic tables (fast, no fixtures): what fires, what does not, and
the numbers in its evidence, known by construction."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import orchestrator.analyze.rules as rules_pkg
from orchestrator.analyze.model_overhead import CaptureOverhead, RankOverhead
from orchestrator.analyze.model_report import Finding, Imbalance, StageMetrics, StepRow
from orchestrator.analyze.rules import registry
from orchestrator.analyze.rules.base import finding
from orchestrator.ranklist import ranges
from tests.rulekit import context, rank

pytestmark = pytest.mark.fast


def _run(kind: str, ctx) -> list[Finding]:
    (rule,) = [r for r in registry() if r.kind == kind]
    return rule.evaluate(ctx)


def test_registry_one_rule_per_module() -> None:
    mods = [m.name for m in pkgutil.iter_modules(rules_pkg.__path__) if m.name != "base"]
    kinds = [r.kind for r in registry()]
    assert len(kinds) == len(set(kinds)) == len(mods)
    for m in mods:
        rule = importlib.import_module(f"orchestrator.analyze.rules.{m}").RULE
        assert rule.__doc__ or importlib.import_module(f"orchestrator.analyze.rules.{m}").__doc__


def test_data_loader_stall_threshold_and_cpu_state() -> None:
    gap_cpu = [{"rank": 0, "range_group": "between steps (input pipeline)", "call": "pthread_cond_wait", "ns": 4e6},
               {"rank": 0, "range_group": "between steps (input pipeline)", "call": None, "ns": 2e6}]
    ctx = context([rank(0, gaps_by_range_ms={"between steps (input pipeline)": 6.0}),
                   rank(1, gaps_by_range_ms={"data_load": 4.0}), rank(2, gaps_by_range_ms={"data_load": 7.0})],
                  {"gap_cpu": gap_cpu, "cp_roots": [], "cp_steps": []})
    (f,) = _run("data_loader_stall", ctx)
    assert f.ranks == [0, 2] and f.cost_ms == 7.0 and f.severity == "medium"
    assert f.evidence == [  # the worst rank first
        "rank 2: GPU idle 7.0 ms inside data-loading ranges or between steps (7.0% of its window)",
        "rank 0: GPU idle 6.0 ms inside data-loading ranges or between steps (6.0% of its window)",
        "rank 0's loop thread was in `pthread_cond_wait` for 67% of that idle time: blocked waiting (e.g. on the "
        "DataLoader workers' queue or a lock)"]


def test_cpu_gap_ignores_data_ranges() -> None:
    ctx = context([rank(0, gaps_by_range_ms={"optimizer": 25.0, "fetch batch": 50.0})])
    (f,) = _run("cpu_gap", ctx)
    assert f.title == "GPU idle while the CPU is in `optimizer`" and f.severity == "high"


def test_a_gap_named_after_the_loop_threads_call_is_never_the_inputs() -> None:
    """`cuLibraryLoadData` (the driver loading a kernel's module on first use) holds "load": a gap
    named after the call the loop thread was in is the call's, not the input pipeline's, whatever
    its words; a range the user or orch's marks named stays the input's."""
    ctx = context([rank(0, gaps_by_range_ms={"loop thread in cuLibraryLoadData": 26.6, "orch: next batch": 4.2})],
                  {"cp_roots": [], "cp_steps": []})
    assert _run("data_loader_stall", ctx) == []  # 4.2 ms of input: under its 5 % threshold
    (f,) = _run("cpu_gap", ctx)
    assert f.title == "GPU idle while the loop thread is in `cuLibraryLoadData`" and f.cost_ms == 26.6
    ctx = context([rank(0, gaps_by_range_ms={"data_load": 6.0, "between steps (input pipeline)": 1.0})],
                  {"cp_roots": [], "cp_steps": []})
    (g,) = _run("data_loader_stall", ctx)
    assert g.cost_ms == 7.0


PY = "loop thread in Python between CUDA calls"


def test_cpu_gap_names_the_python_function_its_samples_found_and_costs_its_share() -> None:
    """20 of 25 samples in the gaps in `mask_tokens`: the title and fix name it, and fixing it
    saves 20/25 of the 40 ms of idle; the library frame under a function is said in the evidence."""
    samples = [{"rank": 0, "range_group": PY, "func": "mask_tokens (train.py:96)", "leaf": None, "n": 20},
               {"rank": 0, "range_group": PY, "func": "run (train.py:150)",
                "leaf": "_engine_run_backward (torch/autograd/graph.py:860)", "n": 5},
               {"rank": 0, "range_group": "data_load", "func": "Tokens.__getitem__ (train.py:70)", "leaf": None,
                "n": 9}]
    (f,) = _run("cpu_gap", context([rank(0, gaps_by_range_ms={PY: 40.0})], {"gap_python": samples}))
    assert f.title == ("GPU idle while the loop thread runs Python between CUDA calls: `mask_tokens` "
                       "(train.py:96)")
    assert "`mask_tokens` (train.py:96)" in f.fix and f.cost_ms == pytest.approx(32.0)
    assert ("rank 0's loop thread was in `mask_tokens` (train.py:96) in 20 of the 25 Python samples orch took "
            "in that idle time (80%)") in f.evidence


def test_cpu_gap_merges_the_loop_threads_states_one_function_holds() -> None:
    """A checkpoint: 30 ms of idle in Python, 20 in `fclose` and 10 in `fopen`, the samples of each
    at least 80 % in `save_checkpoint`, under torch.save: one finding for the function, costed as
    its share of the three (27 + 20 + 10 = 57 ms), with the checkpoint's fix. The 5 ms in `write`,
    whose samples are elsewhere, stays its own group (under the 10 % threshold of a 100 ms window:
    no finding). With the `fclose` samples elsewhere too, only two states merge."""
    leaf = "_save (torch/serialization.py:1184)"
    samples = [{"rank": 0, "range_group": PY, "func": "save_checkpoint (train.py:200)", "leaf": leaf, "n": 9},
               {"rank": 0, "range_group": PY, "func": "run (train.py:150)", "leaf": None, "n": 1},
               {"rank": 0, "range_group": "loop thread in fclose", "func": "save_checkpoint (train.py:200)",
                "leaf": leaf, "n": 4},
               {"rank": 0, "range_group": "loop thread in fopen", "func": "save_checkpoint (train.py:200)",
                "leaf": leaf, "n": 2},
               {"rank": 0, "range_group": "loop thread in write", "func": "log (train.py:99)", "leaf": None, "n": 3}]
    gaps = {PY: 30.0, "loop thread in fclose": 20.0, "loop thread in fopen": 10.0, "loop thread in write": 5.0}
    ctx = context([rank(0, gaps_by_range_ms=gaps, window_ms=100.0)], {"gap_python": samples})
    (f,) = _run("cpu_gap", ctx)
    assert f.title == ("GPU idle while the loop thread runs `save_checkpoint` (train.py:200) in `_save` "
                       "(torch/serialization.py:1184) (in `Python between CUDA calls`, `fclose`, `fopen`)")
    assert f.cost_ms == pytest.approx(57.0) and "torch.distributed.checkpoint.async_save" in f.fix
    split = [dict(r, func="close_all (train.py:300)") if r["range_group"] == "loop thread in fclose" else r
             for r in samples]
    found = _run("cpu_gap", context([rank(0, gaps_by_range_ms=gaps, window_ms=100.0)], {"gap_python": split}))
    assert sorted(round(g.cost_ms, 3) for g in found) == [20.0, 37.0], [(g.title, g.cost_ms) for g in found]


def test_cpu_gap_names_no_function_on_too_few_samples() -> None:
    """One sample in 40 ms of idle (a thread blocked in a wait is sampled rarely) names nothing:
    its share is 100 % whatever the thread did. The merged states need the function's samples
    together too: 2 + 1 of them merge nothing, and neither state alone reaches the 10 % of the
    window a finding needs."""
    one = [{"rank": 0, "range_group": PY, "func": "parameters (torch/nn/modules/module.py:2666)", "leaf": None,
            "n": 1}]
    (f,) = _run("cpu_gap", context([rank(0, gaps_by_range_ms={PY: 40.0})], {"gap_python": one}))
    assert f.title == "GPU idle while the loop thread runs Python between CUDA calls" and f.cost_ms == 40.0
    assert not any("Python samples" in e for e in f.evidence)
    few = [{"rank": 0, "range_group": PY, "func": "run (train.py:150)", "leaf": None, "n": 2},
           {"rank": 0, "range_group": "loop thread in pthread_cond_wait", "func": "run (train.py:150)", "leaf": None,
            "n": 1}]
    gaps = {PY: 6.0, "loop thread in pthread_cond_wait": 8.0}
    assert _run("cpu_gap", context([rank(0, gaps_by_range_ms=gaps, window_ms=100.0)], {"gap_python": few})) == []
    enough = [dict(r, n=r["n"] * 2) for r in few]
    (g,) = _run("cpu_gap", context([rank(0, gaps_by_range_ms=gaps, window_ms=100.0)], {"gap_python": enough}))
    assert g.title.startswith("GPU idle while the loop thread runs `run` (train.py:150)") and g.cost_ms == 14.0


def test_cpu_gap_while_the_loop_thread_waits_for_another_thread() -> None:
    """Gaps in backward() whose next kernel the autograd thread launched (40_gaps.sql names them so):
    the finding says whom the GPU waited for, with the backward's fix; the loop thread's own
    samples there (it only waited) name nothing and merge nothing. Another thread: its own fix."""
    name = "loop thread in pthread_cond_wait for the autograd thread"
    samples = [{"rank": 0, "range_group": name, "func": "run (train.py:150)", "leaf": None, "n": 9},
               {"rank": 0, "range_group": PY, "func": "run (train.py:150)", "leaf": None, "n": 9}]
    gaps = {name: 30.0, PY: 4.0}
    (f,) = _run("cpu_gap", context([rank(0, gaps_by_range_ms=gaps, window_ms=100.0)], {"gap_python": samples}))
    assert f.title == "GPU idle while the loop thread waits in `pthread_cond_wait` for its autograd thread"
    assert f.fix.startswith("The GPU waits for the autograd engine's thread") and f.cost_ms == 30.0
    assert not any("Python samples" in e for e in f.evidence)
    other = {"loop thread in sem_wait for another thread": 30.0}
    (g,) = _run("cpu_gap", context([rank(0, gaps_by_range_ms=other, window_ms=100.0)]))
    assert g.title == "GPU idle while the loop thread waits in `sem_wait` for another of its threads"
    assert g.fix.startswith("The GPU waits for another of its threads, which launched its next work")


def test_cpu_gap_under_torch_compiles_runtime_gets_the_compile_fix() -> None:
    """The samples in a loop's own function under AOTAutograd's wrappers: torch.compile's Python
    per call, which no Dataset or vectorising moves; its fix is the compile's."""
    samples = [{"rank": 0, "range_group": PY, "func": "main (train.py:61)",
                "leaf": "unwrap_dead_wrappers.<locals>.<genexpr> (torch/_functorch/utils.py:34)", "n": 14},
               {"rank": 0, "range_group": PY, "func": "run (train.py:150)", "leaf": None, "n": 2}]
    (f,) = _run("cpu_gap", context([rank(0, gaps_by_range_ms={PY: 40.0})], {"gap_python": samples}))
    assert f.fix.startswith("The loop thread runs torch.compile's own Python around the compiled code in `main`")
    assert "mode='reduce-overhead'" in f.fix and "Dataset" not in f.fix


def test_cpu_gap_without_samples_keeps_its_title_and_cost() -> None:
    (f,) = _run("cpu_gap", context([rank(0, gaps_by_range_ms={PY: 40.0})]))
    assert f.title == "GPU idle while the loop thread runs Python between CUDA calls" and f.cost_ms == 40.0


def test_data_loader_stall_says_the_python_its_samples_found() -> None:
    samples = [{"rank": 0, "range_group": "orch: next batch", "func": "Tokens.__getitem__ (train.py:70)",
                "leaf": "tokenise (tok/bpe.py:12)", "n": 9}]
    ctx = context([rank(0, gaps_by_range_ms={"orch: next batch": 30.0})],
                  {"gap_cpu": [], "gap_python": samples, "cp_roots": [], "cp_steps": []})
    (f,) = _run("data_loader_stall", ctx)
    assert ("rank 0's loop thread was in `Tokens.__getitem__` (train.py:70) in `tokenise` (tok/bpe.py:12) in 9 "
            "of the 9 Python samples orch took in that idle time (100%)") in f.evidence


def test_data_loader_stall_counts_the_workers_that_would_keep_up() -> None:
    """Rank 0's 2 workers set its pace: 10 steps of 40 ms in which its loop thread waits 20 ms for
    the next batch. Each worker takes 2 x 40 = 80 ms a batch, and a step of 20 ms without the wait
    needs one every 20 ms: 4 workers. Without the run's loader settings, or where the wait is the
    epoch starts' (under the rule's threshold without them), nothing is said of the workers."""
    from orchestrator.store.loaders import LoaderSettings

    steps = [StepRow(step=i, ms_by_rank={"0": 40.0}, spread_ms=0.0, warmup=i == 0) for i in range(11)]
    views = {"gap_cpu": [], "gap_python": [], "cp_roots": [], "cp_steps": []}
    two = {0: [LoaderSettings(num_workers=2, persistent_workers=True, batch_size=16, dataset="Tokens")]}

    def run(gaps: dict[str, float], loaders: dict) -> Finding:
        ctx = context([rank(0, window_ms=400.0, gaps_by_range_ms=gaps)], views, steps=steps, loaders=loaders)
        (f,) = _run("data_loader_stall", ctx)
        return f

    f = run({"orch: next batch": 200.0}, two)
    assert ("rank 0: its 2 DataLoader workers deliver a batch every 40.0 ms on average and the loop thread waits "
            "20.0 ms of it for the next batch: each worker takes about 80.0 ms a batch, and a step without waiting "
            "(for the batch or for the other ranks) takes 20.0 ms") in f.evidence
    assert f.fix.startswith("The 2 DataLoader workers of rank(s) 0 cannot keep up: DataLoader(num_workers=4) or more "
                            "keeps the next batch ready")
    # the general advice after the count does not ask for num_workers>0 again
    assert "DataLoader(pin_memory=True, prefetch_factor>=2" in f.fix and "num_workers>0" not in f.fix
    unknown = run({"orch: next batch": 200.0}, {}).fix
    assert "cannot keep up" not in unknown and "DataLoader(num_workers>0, pin_memory=True" in unknown
    # a rank that also waits 10 ms a step for a peer in collectives (a peer's slower loader paces
    # it too) would take 10 ms a step on its own: 8 workers
    ctx = context([rank(0, window_ms=400.0, exposed_wait_ms=100.0, gaps_by_range_ms={"orch: next batch": 200.0})],
                  views, steps=steps, loaders=two)
    (w,) = _run("data_loader_stall", ctx)
    assert "DataLoader(num_workers=8) or more" in w.fix
    # under nsys, whose per-call cost is estimated at 60 ms of the window (6 ms a step), the step
    # without waiting takes 14 ms without it: 80 / 14 -> 6 workers, not 80 / 20 -> 4
    over = CaptureOverhead(call_ns=7600, line="", ranks=[RankOverhead(
        rank=0, window_ms=400.0, profiler_ms=0.0, api_calls=7895, launches=4000, est_ms=60.0, share_pct=15.0,
        distorted=True)])
    ctx = context([rank(0, window_ms=400.0, gaps_by_range_ms={"orch: next batch": 200.0})], views, steps=steps,
                  loaders=two, capture_overhead=over)
    (p,) = _run("data_loader_stall", ctx)
    assert "DataLoader(num_workers=6) or more" in p.fix
    # ... and without it the loop waits 6 ms a step longer for its batches: 200 + 10 x 6 ms saved
    assert p.cost_ms == 200.0 and p.unprofiled_ms == 260.0
    assert ("a step without waiting (for the batch or for the other ranks) takes 20.0 ms here, about 14.0 ms "
            "without the profiler (nsys' own per-call cost, estimated at 6.0 ms a step)") in " ".join(p.evidence)
    # the wait is the epoch starts' (workers started anew), not the steady one's
    anew = {0: [LoaderSettings(num_workers=2, persistent_workers=False, batch_size=16, dataset="Tokens")]}
    g = run({"orch: next batch": 19.0, "orch: loader start": 180.0}, anew)
    assert "anew" in g.fix and "cannot keep up" not in g.fix


def test_data_loader_stall_names_workers_that_start_anew_every_epoch() -> None:
    """8 of rank 0's 18 ms of input idle fall while the loop thread starts an epoch's batches, and
    its loader's 4 workers are not persistent: the fix keeps them. Persistent workers (or the idle
    elsewhere) leave the fix as it was."""
    from orchestrator.store.loaders import LoaderSettings

    gaps = {"orch: next batch": 10.0, "orch: loader start": 8.0}
    views = {"gap_cpu": [], "gap_python": [], "cp_roots": [], "cp_steps": []}

    def run(persistent: bool, gaps: dict[str, float]) -> Finding:
        loader = LoaderSettings(num_workers=4, persistent_workers=persistent, batch_size=16, dataset="Tokens")
        (f,) = _run("data_loader_stall", context([rank(0, gaps_by_range_ms=gaps)], views, loaders={0: [loader]}))
        return f

    f = run(False, gaps)
    assert f.cost_ms == 18.0
    assert ("rank 0: 8.0 ms of it while the loop thread started an epoch's batches (`orch: loader start`: "
            "DataLoader.__iter__), where a loader without persistent_workers starts its workers anew") in f.evidence
    assert f.fix.startswith("Rank(s) 0 start their DataLoader's workers anew every epoch: DataLoader(..., "
                            "persistent_workers=True) keeps them")
    for g in (run(True, gaps), run(False, {"orch: next batch": 18.0})):
        assert "anew" not in g.fix and not [e for e in g.evidence if "loader start" in e]
    # A report without the run's loader settings: the loop thread forking in that idle says it.
    views["gap_cpu"] = [{"rank": 0, "range_group": "orch: loader start", "call": "fork", "ns": 5_000_000},
                        {"rank": 0, "range_group": "orch: loader start", "call": "poll", "ns": 3_000_000}]
    (h,) = _run("data_loader_stall", context([rank(0, gaps_by_range_ms=gaps)], views))
    assert h.fix.startswith("Rank(s) 0 start their DataLoader's workers anew every epoch")
    assert h.evidence[-1].endswith("starts its workers anew: 5.0 ms in `fork`, starting processes")


def test_pageable_memcpy() -> None:
    rows = [{"rank": 0, "kind": "HtoD", "src_kind": "pageable", "n": 2, "bytes": 8 << 20, "ns": 3_000_000},
            {"rank": 1, "kind": "HtoD", "src_kind": "pinned", "n": 2, "bytes": 8 << 20, "ns": 3_000_000}]
    (f,) = _run("pageable_memcpy", context([rank(0), rank(1)], {"memcpy_window": rows}))
    assert f.ranks == [0] and f.evidence == ["rank 0: 8.0 MiB pageable HtoD in 3.0 ms"] and f.severity == "low"


def test_exposed_communication_excludes_waiting_and_p2p() -> None:
    busy = rank(0, comm_ms=40.0, exposed_comm_ms=40.0, comm_overlap_pct=0.0, nccl_wait_ms=5.0)
    waiting = rank(1, comm_ms=40.0, exposed_comm_ms=40.0, comm_overlap_pct=0.0, nccl_wait_ms=35.0)
    (f,) = _run("exposed_communication", context([busy, waiting]))
    assert f.ranks == [0] and f.cost_ms == 35.0 and f.severity == "high"


def test_exposed_communication_saves_at_most_the_compute_it_could_hide_under() -> None:
    """Overlap hides communication under compute not already overlapping it: with 3 ms of such
    compute the fix saves 3 ms of 35 (a collectives benchmark, with none, saves nothing: info)."""
    small = rank(0, comm_ms=40.0, exposed_comm_ms=40.0, comm_overlap_pct=0.0, nccl_wait_ms=5.0, compute_ms=4.0,
                 overlap_ms=1.0)
    (f,) = _run("exposed_communication", context([small]))
    assert f.cost_ms == 3.0 and f.severity == "low"
    assert "rank 0: only 3.0 ms of compute does not already overlap communication" in f.evidence[1]
    (g,) = _run("exposed_communication", context([rank(0, comm_ms=40.0, exposed_comm_ms=40.0, comm_overlap_pct=0.0,
                                                       compute_ms=0.0, overlap_ms=0.0)]))
    assert g.cost_ms == 0.0 and g.severity == "info"


def test_stage_imbalance_names_victims() -> None:
    stages = [StageMetrics(stage=0, ranks=[0, 2, 4, 5, 6, 7], compute_ms=40.0, bubble_pct=60.0, gpu_idle_pct=1.0),
              StageMetrics(stage=1, ranks=[1], compute_ms=80.0, bubble_pct=20.0, gpu_idle_pct=1.0)]
    rows = [{"stage": 0, "window_ns": 200_000_000}, {"stage": 1, "window_ns": 200_000_000}]
    ctx = context([rank(r) for r in range(8) if r != 3], {"stage_metrics": rows}, stages=stages,
                  imbalance=Imbalance(ratio=2.0, slowest_stage=1, fastest_stage=0))
    (f,) = _run("stage_imbalance", ctx)
    assert f.ranks == [1] and f.victims == [0, 2, 4, 5, 6, 7] and f.severity == "high" and "about 25%" in f.fix
    assert f.evidence[0].startswith("stage 0 (ranks 0, 2, 4-7): compute 40.0 ms")  # ranges, not a list
    # Microbatches unknown: at least the 20 ms stage 1 computes above the mean (60 ms), 10% of its window.
    assert f.cost_ms == 20.0 and f.cost_pct == 10.0


def test_stage_imbalance_costs_what_balancing_saves() -> None:
    """2 stages, 4 microbatches: the step is (m+p-1)/m = 1.25x the slowest stage's compute, so
    balanced at the mean (60 ms) it loses 1.25 x (80 - 60) = 25 ms, not the 40 ms between them."""
    stages = [StageMetrics(stage=i, ranks=[i], compute_ms=c, bubble_pct=b, gpu_idle_pct=1.0, theory_bubble_pct=20.0,
                           microbatches=4) for i, (c, b) in enumerate(((40.0, 60.0), (80.0, 20.0)))]
    rows = [{"stage": 0, "window_ns": 125_000_000}, {"stage": 1, "window_ns": 125_000_000}]
    ctx = context([rank(0), rank(1)], {"stage_metrics": rows}, stages=stages,
                  imbalance=Imbalance(ratio=2.0, slowest_stage=1, fastest_stage=0))
    (f,) = _run("stage_imbalance", ctx)
    assert f.cost_ms == 25.0 and f.cost_pct == 20.0
    assert "1/(1 - 20.0%) = 1.25x" in f.evidence[-1]


def test_launch_bound() -> None:
    tables = {"kernel_stats": [{"rank": 0, "n": 2000, "median_ns": 8000, "n_steps": 4}],
              "small_gaps": [{"rank": 0, "n": 1990, "ns": 15_000_000}],
              "graph_usage": [{"rank": 1}],  # another rank replays CUDA graphs, not this one
              "capture_overhead": [{"rank": 0, "est_ns": 2_000_000, "api_calls": 300}]}  # under 25 %: not said
    (f,) = _run("launch_bound", context([rank(0)], tables))
    assert f.evidence == ["rank 0: 2000 kernels (median 8.0 us), 1990 sub-threshold gaps totalling 15.0 ms"]
    assert f.cost_ms == 15.0
    # nsys's estimated per-call cost explains 4 of the 15 ms: said, with what the fix saves
    # without the profiler; the saving is this capture's (its twin with the fix loses the calls'
    # nsys cost too), the severity the 11 ms left (11 % of the window: medium, not the 15 %'s).
    tables["capture_overhead"] = [{"rank": 0, "est_ns": 4_000_000, "est_err_ns": 2_240_000, "api_calls": 520}]
    (t,) = _run("launch_bound", context([rank(0)], tables))
    assert (t.unprofiled_ms, t.unprofiled_err_ms, f.unprofiled_err_ms) == (11.0, 2.24, None)
    assert t.evidence[1].startswith("rank 0: ≈ 4.0 ms of those gaps is nsys' own per-call cost")
    assert t.evidence[2] == "without the profiler the fix saves about 11.0 ms (the gaps less nsys' estimated share)"
    assert t.cost_ms == 15.0 and t.title == f.title and t.severity == "medium"
    assert "capture steady-state steps with CUDA graphs" in f.fix
    # 12 of the 15 ms: the 3 ms left are under 10 % of the 100 ms window. Not the loop's doing:
    # an info finding that says so and asks for an unprofiled timing, never CUDA graphs.
    tables["capture_overhead"] = [{"rank": 0, "est_ns": 12_000_000, "est_err_ns": 6_720_000, "api_calls": 1600}]
    (p,) = _run("launch_bound", context([rank(0)], tables))
    assert p.title == "launch gaps within what the profiler itself added" and p.severity == "info"
    assert p.cost_ms == 0.0 and "CUDA graphs" not in p.fix.split(".")[0] and "without nsys" in p.fix
    # Two ranks, one explained by nsys and one not: the finding names the other, with its cost.
    two = {"kernel_stats": [{"rank": r, "n": 2000, "median_ns": 8000, "n_steps": 4} for r in (0, 1)],
           "small_gaps": [{"rank": r, "n": 1990, "ns": 15_000_000} for r in (0, 1)], "graph_usage": [{"rank": 5}],
           "capture_overhead": [{"rank": 0, "est_ns": 12_000_000, "est_err_ns": 6_720_000, "api_calls": 1600},
                                {"rank": 1, "est_ns": 1_000_000, "est_err_ns": 560_000, "api_calls": 130}]}
    (m,) = _run("launch_bound", context([rank(0), rank(1)], two))
    assert m.ranks == [1] and m.cost_ms == 15.0 and "capture steady-state steps with CUDA graphs" in m.fix
    assert m.evidence[-1].startswith("rank(s) 0: the gaps left after nsys' share are under 10 % of the window")
    # The nsys-explained rank runs the same kernels and its GPU waited 30 ms of its 100 in
    # collectives: it waited there for rank 1's launches, the same loop, named with it (the cost
    # stays rank 1's own gaps). Waiting under 10 % of the window, or other kernels: not named.
    (s,) = _run("launch_bound", context([rank(0, exposed_wait_ms=30.0), rank(1)], two))
    assert s.ranks == [0, 1] and s.cost_ms == 15.0
    assert s.evidence[-1] == ("rank 0: the same kernels as launch-bound rank 1 (2000, median 8.0 us): the same loop; "
                              "its GPU waited 30.0 ms in collectives not overlapped with compute, for its peers' "
                              "launches, where its own launch gaps would show")
    (w,) = _run("launch_bound", context([rank(0, exposed_wait_ms=9.0), rank(1)], two))
    assert w.ranks == [1]
    two["kernel_stats"][0]["n"] = 2100  # 5 % more kernels: another loop
    (o,) = _run("launch_bound", context([rank(0, exposed_wait_ms=30.0), rank(1)], two))
    assert o.ranks == [1]
    # The same rank already replaying CUDA graphs is told to capture what is left, not to adopt them.
    tables["graph_usage"] = [{"rank": 0}]
    tables["capture_overhead"] = [{"rank": 0, "est_ns": 2_000_000, "api_calls": 300}]
    (f,) = _run("launch_bound", context([rank(0)], tables))
    assert "already replays" in f.fix and "reduce-overhead" not in f.fix
    # A loop compiled without CUDA graphs (a quarter or more of its kernels Inductor's) is told to
    # compile with them, not to adopt torch.compile; 1 kernel in 5 is no compiled loop.
    tables["graph_usage"] = []
    tables["kernel_origins"] = [{"rank": 0, "kernels": 2000, "generated": 600}]
    (c,) = _run("launch_bound", context([rank(0)], tables))
    assert c.fix.startswith("The GPU waits on kernel launches, and the loop already runs torch.compile")
    assert c.evidence[-1] == ("rank 0: 600 of its 2,000 kernels (30%) are Inductor's generated Triton kernels: the "
                              "loop runs torch.compile already")
    tables["kernel_origins"][0]["generated"] = 400
    (e,) = _run("launch_bound", context([rank(0)], tables))
    assert "capture steady-state steps with CUDA graphs" in e.fix and not any("Inductor" in x for x in e.evidence)


def _cp(roots: list[tuple[int, int, float, str | None, list[int]]], n_steps: int = 4,
        saving: float = 1.0) -> dict[str, list[dict]]:
    """cp_steps of 100 ms each and cp_roots rows (step, rank, created ms, phase, victims), each
    step saving `saving` of what its root created."""
    return {"cp_steps": [{"step": i, "rank": 0, "t0": i * 100_000_000, "t1": (i + 1) * 100_000_000}
                         for i in range(1, n_steps + 1)],
            "cp_roots": [{"step": st, "rank": rk, "created_ns": ms * 1e6, "phase": ph, "step_ns": 100_000_000,
                          "share_pct": ms, "victims": v, "saving_ns": saving * ms * 1e6}
                         for st, rk, ms, ph, v in roots],
            "kernel_excess": [], "kernel_excess_rank": [], "cpu_call_excess": [], "small_gaps": [],
            "capture_overhead": []}


def test_straggler_root_phase_victims_cost() -> None:
    """The root of two steps' critical paths, 60 ms each in `data_load`: named with its phase,
    its victims, and what it put on the path (120 ms of 400: high)."""
    ctx = context([rank(0), rank(1), rank(2)],
                  _cp([(2, 1, 60.0, "data_load", [0, 2]), (3, 1, 60.0, "data_load", [0])]))
    (f,) = _run("straggler", ctx)
    assert f.ranks == [1] and f.victims == [0, 2] and f.severity == "high" and f.cost_ms == 120.0
    assert f.title == "rank 1 holds up rank(s) 0, 2 (in `data_load`)"
    assert f.evidence[0].startswith("rank 1 is the root of the critical path in 2 of 4 steps: it put 120.0 ms")


def test_straggler_costs_what_its_steps_would_save() -> None:
    """A DDP root whose victims' buckets waited 40 ms a step in all (what it put on the path) but
    whose GPUs lost 8 ms a step to it: the finding costs the 8 ms (16 ms of 400: low), and a root
    whose victims lost under 5 ms a step in half the steps is no finding."""
    (f,) = _run("straggler", context([rank(0), rank(1)], _cp([(1, 0, 40.0, None, [1]), (2, 0, 40.0, None, [1])],
                                                             saving=0.2)))
    assert f.cost_ms == 16.0 and f.severity == "low"
    assert "at the others' pace those steps would take 16.0 ms less (4.0% of the steps' time" in f.evidence[0]
    assert _run("straggler", context([rank(0), rank(1)], _cp([(1, 0, 40.0, None, [1]), (2, 0, 40.0, None, [1])],
                                                             saving=0.1))) == []


def test_straggler_quiet_on_small_or_single_skews() -> None:
    """A few ms in half the steps, or one large step only, never statistically late: no finding
    (a healthy job's skews, one hiccup); 20-30 ms in half the 100 ms steps is a consistent root."""
    assert _run("straggler", context([rank(0), rank(1)], _cp([(1, 0, 2.0, None, [1]), (2, 0, 3.0, None, [1])]))) == []
    assert _run("straggler", context([rank(0), rank(1)], _cp([(1, 0, 90.0, None, [1])]))) == []
    (f,) = _run("straggler", context([rank(0), rank(1)], _cp([(1, 0, 20.0, None, [1]), (2, 0, 30.0, None, [1])])))
    assert f.ranks == [0] and f.cost_ms == 50.0 and f.title == "rank 0 holds up rank(s) 1 (GPU computing)"
    # A rank with no computing kernels at all (a collectives benchmark): its collectives start late.
    (g,) = _run("straggler", context([rank(0, compute_ms=0.0), rank(1, compute_ms=0.0)],
                                     _cp([(1, 0, 20.0, None, [1]), (2, 0, 30.0, None, [1])])))
    assert g.title == "rank 0 holds up rank(s) 1 (GPU work starting late)"


def test_straggler_computing_says_which_kernels_or_that_its_work_starts_late() -> None:
    """A root whose GPU was computing: the kernels it runs beyond the median rank's name the cause
    (8 extra GEMMs a step, 9 ms); kernels no longer than the others' say its work starts late."""
    tables = _cp([(1, 0, 20.0, None, [1]), (2, 0, 30.0, None, [1])])
    tables["kernel_excess_rank"] = [{"rank": 0, "ns_per_step": 59e6, "median_ns_per_step": 50e6,
                                     "excess_ns_per_step": 9e6}]
    tables["kernel_excess"] = [{"rank": 0, "short_name": "sm90_xmma_gemm", "n_per_step": 8.0, "median_n_per_step": 0.0,
                                "ns_per_step": 9e6, "median_ns_per_step": 0.0, "excess_ns_per_step": 9e6}]
    (f,) = _run("straggler", context([rank(0), rank(1)], tables))
    assert f.title == "rank 0 holds up rank(s) 1 (GPU computing)"
    assert ("rank 0's computing kernels take 59.0 ms a step against 50.0 ms on the median rank (+9.0 ms; it holds a "
            "step it is the root of up by a median 30.0 ms); most above the median rank's: `sm90_xmma_gemm` 8 a step "
            "against 0, +9.0 ms") in f.evidence
    assert f.fix.startswith("Rank 0's GPU computes more a step than the median rank's (`sm90_xmma_gemm` 8 a step")
    tables["kernel_excess_rank"][0].update(ns_per_step=50.5e6, excess_ns_per_step=0.5e6)  # 0.5 ms < 25 % of 30 ms
    tables["kernel_excess"] = []
    (g,) = _run("straggler", context([rank(0), rank(1)], tables))
    assert g.title == "rank 0 holds up rank(s) 1 (GPU work starting late)"
    assert g.fix.startswith("Rank 0's kernels take no longer than the median rank's: its GPU work starts late")
    # An OS call its loop thread makes that the median rank does not, worth a quarter of the
    # 30 ms it holds a step up, is named (one under that share is not).
    call = {"rank": 0, "name": "write", "ns_per_step": 12e6, "median_ns_per_step": 0.0, "excess_ns_per_step": 12e6}
    tables["cpu_call_excess"] = [call, {**call, "rank": 1, "name": "fsync"}]
    (h,) = _run("straggler", context([rank(0), rank(1)], tables))
    assert h.title == "rank 0 holds up rank(s) 1 (GPU work starting late: its loop thread in `write`)"
    assert ("rank 0's loop thread spends 12.0 ms a step in `write` against 0.0 ms on the median rank (+12.0 ms a "
            "step more than the others)") in h.evidence
    assert h.fix.startswith("Rank 0's GPU work starts late because its loop thread is in `write` each step")
    tables["cpu_call_excess"] = [{**call, "ns_per_step": 7e6, "excess_ns_per_step": 7e6}]  # 7 ms < 25 % of 30 ms
    (k,) = _run("straggler", context([rank(0), rank(1)], tables))
    assert k.title == g.title
    # No such call, but its GPU waits between kernels 10 ms a step more than the median rank's
    # (3 ranks, 4 steps): its CPU launches slower.
    tables["cpu_call_excess"] = []
    tables["small_gaps"] = [{"rank": 0, "n": 900, "ns": 4 * 12e6}, {"rank": 1, "n": 300, "ns": 4 * 2e6},
                            {"rank": 2, "n": 300, "ns": 4 * 2e6}]
    (m,) = _run("straggler", context([rank(0), rank(1), rank(2)], tables))
    assert m.title == "rank 0 holds up rank(s) 1 (GPU work starting late: its kernel launches are slower)"
    assert ("rank 0's GPU waits 12.0 ms a step between kernels (gaps under 1.0 ms) against 2.0 ms on the median "
            "rank: its CPU launches the same kernels slower") in m.evidence
    assert m.fix.startswith("Rank 0 launches the same kernels as the others, slower")
    # Of two ranks the median leaves the root out: it is the other rank's (with the root in it,
    # the upper median of two is the root's own 12 ms and nothing would stand out).
    (two,) = _run("straggler", context([rank(0), rank(1)], {**tables, "small_gaps": tables["small_gaps"][:2]}))
    assert two.title == m.title
    # Every rank's GPU waits between kernels 5 % of its 100 ms window or more (8 ms in 4 steps):
    # the loop is launch-bound everywhere and the slowest launcher is that at its worst, within
    # the run-to-run noise (info); where the others barely wait (0.4 ms), the root's slower
    # launches stand alone.
    assert m.severity == "info" and any(e.startswith("every rank's GPU waits between its kernels (2.0-12.0 ms a step)")
                                       for e in m.evidence)
    quiet = [{**g, "ns": 4e5} if g["rank"] else g for g in tables["small_gaps"]]
    (alone,) = _run("straggler", context([rank(0), rank(1), rank(2)], {**tables, "small_gaps": quiet}))
    assert alone.title == m.title and alone.severity not in ("low", "info")
    assert not any(e.startswith("every rank's GPU waits") for e in alone.evidence)
    tables["small_gaps"][0]["ns"] = 4 * 8e6  # 6 ms more a step: under 25 % of the 30 ms it holds a step up
    (q,) = _run("straggler", context([rank(0), rank(1), rank(2)], tables))
    assert q.title == g.title
    # Late GPU work with no call to name, in a loop launch-bound on every rank: info as well.
    assert q.severity == "info" and g.severity != "info"


def test_a_root_the_profiler_can_account_for_is_info() -> None:
    """A root with no cause of its own (its kernels no longer than the others', no OS call) whose
    fix would save 90 ms of 4 steps of 100 ms: where tracing cost it 36 % of its window (nsys' own
    estimate, capture_overhead), 144 ms of those steps, the profiler can account for it and the
    finding is info; at 20 %, 80 ms, it cannot, and the finding keeps its severity."""
    tables = _cp([(1, 0, 20.0, None, [1]), (2, 0, 30.0, None, [1]), (3, 0, 40.0, None, [1])])
    tables["kernel_excess_rank"] = [{"rank": 0, "ns_per_step": 50e6, "median_ns_per_step": 50e6,
                                     "excess_ns_per_step": 0.0}]
    over = {"rank": 0, "window_ns": 400e6, "est_ns": 144e6}
    (f,) = _run("straggler", context([rank(0), rank(1)], {**tables, "capture_overhead": [over]}))
    assert f.severity == "info" and f.cost_ms == 90.0
    assert ("what fixing it saves, 90.0 ms, is within what tracing cost rank 0 over these steps (~144.0 ms: nsys' "
            "per-call cost of its CUDA calls, as far as its launch gaps show it): the profiler can account for it, "
            "and where its cost lands changes from run to run; time the job without it before acting") in f.evidence
    (g,) = _run("straggler", context([rank(0), rank(1)], {**tables, "capture_overhead": [{**over, "est_ns": 80e6}]}))
    assert g.severity == "high" and not any("the profiler can account" in e for e in g.evidence)
    # A root whose kernels take longer is no profiler artefact, whatever tracing cost it.
    tables["kernel_excess_rank"][0].update(ns_per_step=59e6, excess_ns_per_step=9e6)
    (h,) = _run("straggler", context([rank(0), rank(1)], {**tables, "capture_overhead": [over]}))
    assert h.severity == "high"


def test_straggler_shared_cause_ranks_below() -> None:
    """Every rank idles in one CPU range; the root is only the worst of them: medium, and the
    evidence says the shared cause comes first. Ranks that take turns there are one finding."""
    ph = "all_gather_metrics"
    ctx = context([rank(0, gaps_by_range_ms={ph: 30.0}), rank(1, gaps_by_range_ms={ph: 50.0})],
                  _cp([(s, 1, 60.0, ph, [0]) for s in (1, 2, 3)]))
    (f,) = _run("straggler", ctx)
    assert f.severity == "medium" and f.ranks == [1]
    assert any(e.startswith(f"every rank idles in `{ph}` (30.0-50.0 ms)") for e in f.evidence)
    turns = context(ctx.report.ranks, _cp([(1, 1, 60.0, ph, [0]), (2, 1, 60.0, ph, [0]),
                                            (3, 0, 70.0, ph, [1]), (4, 0, 70.0, ph, [1])]))
    (t,) = _run("straggler", turns)  # ranks that take turns in the shared cause: one finding
    assert t.ranks == [0, 1] and t.cost_ms == 260.0 and t.severity == "medium" and "take turns" in t.title


def test_one_input_pipeline_slowdown_is_counted_once() -> None:
    """One rank late in its own input pipeline: the straggler names it and the rank it holds up
    and carries the saving; the data-loader finding stays as `info` without a cost for it. Every
    rank idling there (a shared cause): the data-loader finding carries it, and the ranks that
    take turns as the root are `info` without a cost."""
    inp = "between steps (input pipeline)"
    one = context([rank(0, gaps_by_range_ms={inp: 1.0}), rank(1, gaps_by_range_ms={inp: 50.0})],
                  {**_cp([(s, 1, 60.0, inp, [0]) for s in (1, 2, 3)]), "gap_cpu": []})
    (f,) = _run("straggler", one)
    assert f.ranks == [1] and f.severity != "info" and f.cost_ms == 180.0 and f.victims == [0]
    (d,) = _run("data_loader_stall", one)
    assert d.ranks == [1] and d.severity == "info" and d.cost_ms == 0.0
    assert ("rank 1 holds the others up while it waits for its input: the straggler finding on it carries what "
            "fixing it saves") in d.evidence
    both = context([rank(0, gaps_by_range_ms={inp: 30.0}), rank(1, gaps_by_range_ms={inp: 50.0})],
                   {**_cp([(1, 1, 60.0, inp, [0]), (2, 1, 60.0, inp, [0]), (3, 0, 70.0, inp, [1]),
                           (4, 0, 70.0, inp, [1])]), "gap_cpu": []})
    (t,) = _run("straggler", both)
    assert "take turns" in t.title and t.severity == "info" and t.cost_ms == 0.0
    assert t.evidence[0].endswith("rank 0 140.0 ms; rank 1 120.0 ms")
    (e,) = _run("data_loader_stall", both)
    assert e.ranks == [0, 1] and e.severity != "info" and e.cost_ms == 50.0


def test_pipeline_bubble_splits_theory_from_excess_and_names_the_root() -> None:
    """Bubble 35% / 32% with theory (p-1)/(m+p-1) = 1/5 = 20%: the finding costs the worst excess
    (15% of a 100 ms window), names the critical path's root as its source; a bubble at theory
    is the schedule's price (no finding), and a heavy stage is stage_imbalance's finding."""
    def stages(b0: float, b1: float) -> list[StageMetrics]:
        return [StageMetrics(stage=i, ranks=[i], compute_ms=70.0, bubble_pct=b, gpu_idle_pct=1.0,
                             theory_bubble_pct=20.0, microbatches=4, excess_bubble_pct=round(b - 20.0, 2))
                for i, b in enumerate((b0, b1))]
    rows = [{"stage": 0, "p2p_wait_ns": 20_000_000, "window_ns": 100_000_000},
            {"stage": 1, "p2p_wait_ns": 18_000_000, "window_ns": 100_000_000}]
    roots = [{"step": s, "rank": 1, "created_ns": 10e6, "phase": "data_load", "victims": [0]} for s in (1, 2, 3)]
    even = Imbalance(ratio=1.03, slowest_stage=1, fastest_stage=0)
    ctx = context([rank(0), rank(1)], {"stage_metrics": rows, "cp_roots": roots}, stages=stages(35.0, 32.0),
                  imbalance=even)
    (f,) = _run("pipeline_bubble", ctx)
    assert f.ranks == [0, 1] and f.severity == "medium" and f.cost_ms == 15.0
    assert f.title == "pipeline bubble: stages idle 15.0% above the schedule's 20.0% of the step (from rank 1)"
    assert "no compute kernel running 35.0% of the window = 20.0% theory + 15.0% excess" in f.evidence[0]
    assert any("(p-1)/(m+p-1) = 20.0%" in e for e in f.evidence)
    assert "rank 1: the root of the critical path in 3 steps, 30.0 ms put on it while in `data_load`" in f.evidence[-1]
    at_theory = context([rank(0), rank(1)], {"stage_metrics": rows, "cp_roots": roots}, stages=stages(22.0, 21.0),
                        imbalance=even)
    assert _run("pipeline_bubble", at_theory) == []
    heavy = context([rank(0), rank(1)], {"stage_metrics": rows, "cp_roots": roots}, stages=stages(35.0, 32.0),
                    imbalance=Imbalance(ratio=2.0, slowest_stage=1, fastest_stage=0))
    assert _run("pipeline_bubble", heavy) == []  # the imbalance is the cause: stage_imbalance says so
    # The root has a straggler finding, which costs what fixing it saves (the bubble's excess
    # with it): the bubble costs what exceeds that, and is info when nothing does.
    root = finding("straggler", [1], "rank 1 holds up rank(s) 0", [], "", 12.0, pct=12.0)
    ctx.findings.append(root)
    (g,) = _run("pipeline_bubble", ctx)
    assert g.cost_ms == 3.0 and g.cost_pct == 3.0 and g.severity == "low"
    assert g.evidence[-1] == ("rank 1's straggler finding (medium) costs what the steps would lose with it at its "
                              "peers' pace, 12.0 ms, this excess included; 3.0 ms of the excess is beyond it")
    ctx.findings[-1] = root.model_copy(update={"cost_ms": 20.0, "severity": "info"})
    (h,) = _run("pipeline_bubble", ctx)
    assert h.cost_ms == 0.0 and h.severity == "info" and h.evidence[-1].endswith(": it is counted there")


def test_pipeline_bubble_is_the_wait_for_the_peer_stage() -> None:
    """With NCCL send/recv kernels, the bubble the pipeline can remove is the wait for the peer
    stage: stages idle 50% (theory 20%) but waiting for each other 23.8% and 14.9% of the window
    (the rest is launch gaps) hold 3.8 points above theory, under the 5-point bar: no finding.
    Waiting 45% makes the excess 25 points, and the finding says the rest is not the pipeline's."""
    def stages(waits: tuple[float, float]) -> list[StageMetrics]:
        return [StageMetrics(stage=i, ranks=[i], compute_ms=50.0, bubble_pct=50.0, gpu_idle_pct=30.0,
                             peer_wait_pct=w, theory_bubble_pct=20.0, microbatches=4, excess_bubble_pct=30.0)
                for i, w in enumerate(waits)]
    rows = [{"stage": i, "p2p_wait_ns": 10_000_000, "window_ns": 100_000_000} for i in (0, 1)]
    even = Imbalance(ratio=1.02, slowest_stage=0, fastest_stage=1)
    launch_bound = context([rank(0), rank(1)], {"stage_metrics": rows, "cp_roots": []}, stages=stages((23.8, 14.9)),
                           imbalance=even)
    assert _run("pipeline_bubble", launch_bound) == []
    waiting = context([rank(0), rank(1)], {"stage_metrics": rows, "cp_roots": []}, stages=stages((45.0, 14.9)),
                      imbalance=even)
    (f,) = _run("pipeline_bubble", waiting)
    assert f.ranks == [0] and f.cost_ms == 25.0 and "25.0% above the schedule's 20.0%" in f.title
    assert any("not the pipeline's" in e for e in f.evidence)


def test_a_pipeline_stage_short_of_input_saves_its_stall_less_the_bubble_it_would_wait_anyway() -> None:
    """Stage 0 idles 40 ms of a 100 ms window for its input and now waits 2% for its peer; on
    time, it would wait the schedule's 20% of the 60 ms left: 12 - 2 = 10 ms of the stall is
    that bubble, so fixing the input saves 30 ms. Stage 1, waiting for stage 0 in send/recv,
    is the same stall seen from downstream: no bubble finding beside it."""
    stages = [StageMetrics(stage=0, ranks=[0], compute_ms=50.0, bubble_pct=45.0, gpu_idle_pct=40.0, peer_wait_pct=2.0,
                           theory_bubble_pct=20.0, microbatches=4, excess_bubble_pct=25.0),
              StageMetrics(stage=1, ranks=[1], compute_ms=50.0, bubble_pct=50.0, gpu_idle_pct=2.0, peer_wait_pct=48.0,
                           theory_bubble_pct=20.0, microbatches=4, excess_bubble_pct=30.0)]
    ranks = [rank(0, gaps_by_range_ms={"between steps (input pipeline)": 40.0}), rank(1)]
    rows = [{"stage": 0, "p2p_wait_ns": 2e6, "window_ns": 100e6}, {"stage": 1, "p2p_wait_ns": 48e6, "window_ns": 100e6}]
    ctx = context(ranks, {"gap_cpu": [], "stage_metrics": rows, "cp_roots": [], "cp_steps": []}, stages=stages,
                  imbalance=Imbalance(ratio=1.0, slowest_stage=0, fastest_stage=1))
    (f,) = _run("data_loader_stall", ctx)
    assert f.ranks == [0] and f.cost_ms == 30.0 and f.cost_pct == 30.0
    assert "would wait for its peers 10.0 ms of it anyway" in f.evidence[1]
    assert len(_run("pipeline_bubble", ctx)) == 1  # alone, stage 1's wait is a bubble 28 points above theory
    ctx.findings.append(f)
    assert _run("pipeline_bubble", ctx) == []  # beside the stall it explains: none


def test_cpu_phase_outlier_data_range_cannot_be_waiting() -> None:
    """Rank 1 loads data 40 ms per step; rank 0 waits it out in `backward` (its DDP all-reduce),
    a slightly larger excess. A data range cannot absorb waiting: rank 1's data_load is the cause."""
    rows = []
    for rk, data, bwd in ((0, 0.1e6, 45e6), (1, 40e6, 5e6)):
        rows += [{"rank": rk, "grp": "data_load", "ns_per_step": data, "offset_ns": 0, "step_ns": 50e6, "n_steps": 4},
                 {"rank": rk, "grp": "backward", "ns_per_step": bwd, "offset_ns": 0, "step_ns": 50e6, "n_steps": 4}]
    metrics = [{"rank": r, "window_source": "steps (cpu only)"} for r in (0, 1)]
    (f,) = _run("cpu_phase_outlier", context([rank(0), rank(1)], {"cpu_phases": rows, "rank_metrics": metrics}))
    assert f.ranks == [1] and "data_load" in f.title and f.victims == [0]


def test_healthy_only_without_high_or_medium() -> None:
    ctx = context([rank(0, gpu_idle_pct=3.0), rank(1, gpu_idle_pct=1.0)])
    found = _run("healthy", ctx)
    assert [f.kind for f in found] == ["healthy"]
    assert _run("healthy", context([rank(0)], findings=[_run("cpu_gap", context(
        [rank(0, gaps_by_range_ms={"optimizer": 25.0})]))[0]])) == []
    assert found[0].evidence == ["GPU busy 97.0-99.0% of the window across ranks"]


def test_gpu_underutilized_from_gpu_metrics() -> None:
    busy_idle_sms = rank(0, compute_ms=80.0, sm_active_pct=20.0, tensor_active_pct=5.0)
    full = rank(1, compute_ms=80.0, sm_active_pct=90.0)
    unsampled = rank(2, compute_ms=80.0)
    (f,) = _run("gpu_underutilized", context([busy_idle_sms, full, unsampled]))
    assert f.ranks == [0] and f.cost_ms == 64.0 and f.severity == "high"
    assert f.evidence == ["rank 0: compute kernels run 80% of the window, SMs active 20.0% on average, "
                          "tensor cores 5.0% (GPU metrics)"]


def test_sync_memcpy_and_memset() -> None:
    rows = [{"rank": 0, "what": "memcpy", "n": 14, "api_ns": 7_000_000, "gpu_ns": 6_000_000, "bytes": 14 << 20,
             "n_steps": 7, "top_api": "cudaMemcpy"},
            {"rank": 1, "what": "memcpy", "n": 1, "api_ns": 100_000, "gpu_ns": 90_000, "bytes": 1 << 20,
             "n_steps": 7, "top_api": "cudaMemcpy"},
            {"rank": 1, "what": "memset", "n": 7, "api_ns": 2_000_000, "gpu_ns": 10_000, "bytes": 7 << 10,
             "n_steps": 7, "top_api": "cudaMemset"}]
    ctx = context([rank(0), rank(1)], {"sync_copies": rows})
    (f,) = _run("sync_memcpy", ctx)  # rank 1's 0.1 ms is under min_share of its 100 ms window
    assert f.ranks == [0] and f.severity == "medium" and f.cost_ms == 7.0
    assert f.evidence == ["rank 0: 14 cudaMemcpy calls (2.0 per step), 14.0 MiB, CPU blocked 7.0 ms (GPU 6.0 ms)"]
    (m,) = _run("sync_memset", ctx)
    assert m.ranks == [1] and m.severity == "low" and m.kind == "sync_memset"


def test_gpu_low_util_costs_only_the_idle_no_cause_claims() -> None:
    """Ten low slices of 2.7 ms idle each on rank 0: 0.7 ms of launch gaps (launch_bound's) and 2 ms
    of longer gaps each. Alone it costs the longer gaps; beside a cause that covers the rank, nothing."""
    slices = [{"rank": 0, "slice": i, "s": i * 3_000_000, "e": (i + 1) * 3_000_000,
               "busy_ns": 300_000 if i < 10 else 3_000_000, "util_pct": 10.0 if i < 10 else 100.0} for i in range(30)]
    slices += [{"rank": 1, "slice": i, "s": 0, "e": 3_000_000, "busy_ns": 3_000_000, "util_pct": 100.0}
               for i in range(30)]
    split = [{"rank": 0, "slice": i, "short_ns": 700_000, "long_ns": 2_000_000} for i in range(10)]
    views = {"gpu_slices": slices, "slice_idle": split}
    (f,) = _run("gpu_low_util", context([rank(0), rank(1)], views))
    assert f.ranks == [0] and f.cost_ms == 20.0 and f.severity == "high"  # 10 x 2 ms of a 100 ms window
    assert f.evidence[0] == ("rank 0: 10 low slices, GPU idle 27.0 ms in them (lowest 10 % busy): 7.0 ms between "
                             "kernels under 1 ms apart (launch gaps), 20.0 ms in longer gaps")
    explained = _run("cpu_gap", context([rank(0, gaps_by_range_ms={"optimizer": 25.0})]))
    (g,) = _run("gpu_low_util", context([rank(0), rank(1)], views, findings=explained))
    assert g.severity == "info" and g.cost_ms == 0.0, g
    assert g.evidence[0].endswith("which the cause found on this rank explains")
    launch_only = [dict(r, short_ns=2_700_000, long_ns=0) for r in split]
    (h,) = _run("gpu_low_util", context([rank(0), rank(1)], {"gpu_slices": slices, "slice_idle": launch_only}))
    assert h.severity == "info" and h.cost_ms == 0.0


def test_gpu_low_util_leaves_out_the_idle_of_one_off_steps() -> None:
    """The same ten low slices, three of them in a one-off step (slice_oneoff: torch.compile's
    graph recording) whose longer gaps fill them: only the other seven slices' longer gaps cost."""
    slices = [{"rank": 0, "slice": i, "s": i * 3_000_000, "e": (i + 1) * 3_000_000,
               "busy_ns": 300_000 if i < 10 else 3_000_000, "util_pct": 10.0 if i < 10 else 100.0} for i in range(30)]
    split = [{"rank": 0, "slice": i, "short_ns": 700_000, "long_ns": 2_000_000} for i in range(10)]
    once = [{"rank": 0, "slice": i, "ns": 2_000_000} for i in (0, 1, 2)] + [{"rank": 0, "slice": 20, "ns": 1_000_000}]
    (f,) = _run("gpu_low_util", context([rank(0)], {"gpu_slices": slices, "slice_idle": split, "slice_oneoff": once}))
    assert f.cost_ms == 14.0 and f.severity == "medium"  # 7 x 2 ms; slice 20 is not a low one
    assert f.evidence[0].endswith("20.0 ms in longer gaps, 6.0 ms of them one-off (warm-up, graph recording, a "
                                  "one-time initialisation), which no other step repeats: left out of the cost")
    (g,) = _run("gpu_low_util", context([rank(0)], {"gpu_slices": slices, "slice_idle": split,
                                                    "slice_oneoff": [dict(r, ns=2_000_000) for r in split]}))
    assert g.severity == "info" and g.cost_ms == 0.0
    assert g.evidence[-1] == ("costs nothing of its own: its launch gaps are the launch-bound finding's, its longer "
                              "gaps one-off idle")


def test_layout_needed_only_without_layout() -> None:
    ranks = [rank(0, p2p_ms=12.5), rank(1)]
    (f,) = _run("layout_needed", context(ranks))
    assert f.ranks == [0] and f.severity == "info" and f.evidence == ["rank 0: 12.5 ms in NCCL send/recv kernels"]
    assert _run("layout_needed", context(ranks, layout={"known": True})) == []


def _comm(units: list[tuple[str, list[int], float]], kind_rows: list[dict] | None = None, nominal: bool = False):
    from orchestrator.analyze.comm import nominal_for
    from orchestrator.analyze.model_comm import CommKindRow, CommReport, CommUnitRow

    return CommReport(
        size_source="nccl_nvtx_payload", sized_kernels=10, comm_kernels=10,
        nominal=nominal_for("NVIDIA H100 80GB HBM3") if nominal else None,
        by_unit=[CommUnitRow(unit=u, ranks=r, scope="inter", kind="all_reduce", size_bucket="64 MiB",
                             bucket_bytes=64 << 20, instances=10, median_busbw_gbps=bw) for u, r, bw in units],
        by_kind=[CommKindRow(**k) for k in (kind_rows or [])])


def test_slow_link_names_the_group_and_node() -> None:
    """Four TP groups of 2 ranks across nodes; the two with rank 6 (host n3) move half the data rate."""
    units = [("group 0,4", [0, 4], 40.0), ("group 1,5", [1, 5], 41.0), ("group 2,6", [2, 6], 12.0),
             ("group 3,7", [3, 7], 39.0), ("p2p 6-7", [6, 7], 10.0), ("p2p 4-5", [4, 5], 38.0),
             ("p2p 0-1", [0, 1], 40.0), ("p2p 2-3", [2, 3], 41.0)]
    kinds = [dict(kind="all_reduce", size_bucket="64 MiB", bucket_bytes=64 << 20, scope="inter", instances=80,
                  median_bytes=64 << 20, transfer_ms=80.0, median_algbw_gbps=35.0, median_busbw_gbps=35.0,
                  p10_busbw_gbps=12.0)]
    ranks = [rank(i, host=f"n{i // 2}") for i in range(8)]
    (f,) = _run("slow_link", context(ranks, comm=_comm(units, kinds)))
    assert f.kind == "slow_link" and f.ranks == [6]
    assert "group 2,6" in f.evidence[0] or "p2p 6-7" in f.evidence[0]
    assert any("ranks 6 (host n3) are in every slow unit" in e for e in f.evidence)
    assert "NCCL_IB_HCA" in f.fix and f.cost_ms > 0


def test_slow_link_quiet_when_peers_agree_or_no_sizes() -> None:
    units = [("group 0,4", [0, 4], 40.0), ("group 1,5", [1, 5], 30.0), ("group 2,6", [2, 6], 35.0)]
    assert _run("slow_link", context([rank(i) for i in range(8)], comm=_comm(units))) == []
    none = _comm(units).model_copy(update={"size_source": "none"})
    assert _run("slow_link", context([rank(0)], comm=none)) == []


def test_slow_link_against_nominal_nvlink() -> None:
    """One host, both ranks equally slow: no peer stands out, but 2.5 GB/s is 0.6 % of NVLink."""
    kinds = [dict(kind="all_reduce", size_bucket="1 GiB", bucket_bytes=1 << 30, scope="intra", instances=8,
                  median_bytes=1 << 30, transfer_ms=3200.0, median_algbw_gbps=2.5, median_busbw_gbps=2.5,
                  p10_busbw_gbps=2.4, pct_of_nominal=0.6),
             dict(kind="all_reduce", size_bucket="4 KiB", bucket_bytes=4096, scope="intra", instances=8,
                  median_bytes=4096, transfer_ms=1.0, median_algbw_gbps=0.1, median_busbw_gbps=0.1,
                  p10_busbw_gbps=0.1, pct_of_nominal=0.0)]
    ranks = [rank(0, window_ms=2000.0), rank(1, window_ms=2000.0)]
    (f,) = _run("slow_link", context(ranks, comm=_comm([], kinds, nominal=True)))
    assert f.ranks == [0, 1] and f.severity == "high" and f.cost_ms == 1600.0
    assert "0.6% of 450 GB/s" in f.evidence[0] and len(f.evidence) == 2  # the 4 KiB row is latency, not judged
    healthy = [dict(k, median_busbw_gbps=330.0, pct_of_nominal=73.3) for k in kinds[:1]]
    assert _run("slow_link", context(ranks, comm=_comm([], healthy, nominal=True))) == []


def test_how_the_job_ended_leads_every_finding() -> None:
    """The outcome of a job that did not complete costs nothing measurable, yet comes first:
    above a costly high finding and above everything else."""
    from orchestrator.analyze.rules import rank_findings
    from orchestrator.analyze.rules.base import finding

    costly = finding("cpu_phase_outlier", [1], "`forward` is slow on rank(s) 1", [], "fix", 50.0, severity="high")
    outcome = finding("job_outcome", [1], "the job hung (TIMEOUT)", [], "fix", 0.0, severity="high")
    low = finding("gpu_low_util", [0], "low", [], "fix", 90.0, severity="low")
    assert [f.kind for f in rank_findings([low, costly, outcome])] == ["job_outcome", "cpu_phase_outlier",
                                                                       "gpu_low_util"]
    assert {r.kind for r in registry() if r.leads} == {"job_outcome"}


def test_a_failed_job_names_the_first_rank_to_fail_and_not_the_ranks_that_lost_it() -> None:
    """2 nodes x 2 ranks on the local Slurm (the job of tests/fixtures/failure/): rank 1 raised;
    rank 2, on the other node, then failed on the connection rank 1 closed. Both exited with
    status 1; the first to fail by its own error is the root, every other rank its victim."""
    from orchestrator.analyze.model_outcome import Outcome, RankOutcome

    exits = {1: "exit status 1", 2: "exit status 1"}
    o = Outcome(state="failed", scheduler_state="FAILED", failed_first=1, failed_step=3,
                line="failed (FAILED): rank 1 failed first (exit status 1): RuntimeError: planted failure at step 3",
                failed_how="rank 1 failed first (exit status 1): RuntimeError: planted failure at step 3",
                ranks=[RankOutcome(rank=r, last_done_step=2, exit=exits.get(r)) for r in range(4)])
    ranks = [rank(r) for r in range(4)]
    (f,) = _run("job_outcome", context(ranks, outcome=o))
    assert (f.ranks, f.victims, f.severity) == ([1], [0, 2, 3], "high")
    assert f.title == f"the job failed (FAILED): {o.failed_how}"
    # No rank known to have failed first: the ranks that exited, as before.
    (g,) = _run("job_outcome", context(ranks, outcome=o.model_copy(update={"failed_first": None})))
    assert (g.ranks, g.victims) == ([1, 2], [])


def test_straggler_many_victims_are_ranges() -> None:
    """39 victims of one root: the title and the evidence give them as rank ranges, one line."""
    victims = [v for v in range(40) if v != 17]
    ctx = context([rank(i) for i in range(40)], _cp([(s, 17, 60.0, "data_load", victims) for s in (2, 3)]))
    (f,) = _run("straggler", ctx)
    assert f.title == "rank 17 holds up rank(s) 0-16, 18-39 (in `data_load`)" and f.victims == victims
    assert [e for e in f.evidence if "waited for rank 17" in e] == [
        "ranks 0-16, 18-39 (39 ranks) waited for rank 17's lateness (directly, or after waiting for a rank that "
        "waited for it): victims, not the cause"]


def test_rank_ranges() -> None:
    assert [ranges([]), ranges([5]), ranges([4, 0, 2, 1, 2])] == ["", "5", "0-2, 4"]
    assert ranges(range(0, 40, 2), most=3) == "0, 2, 4, … (20 ranks)"
    assert ranges(range(0, 40, 2), most=None).count(",") == 19


def test_healthy_runs_after_every_other_final_rule(monkeypatch) -> None:
    """`healthy` summarises every other finding, the final rules' too: a final rule listed after it
    (as `pipeline_bubble` comes after `healthy` by module name) that finds a medium cause leaves
    no "no significant bottleneck found" beside it."""
    from dataclasses import dataclass

    import orchestrator.analyze.rules as rules
    from orchestrator.analyze.rules.base import Rule
    from orchestrator.analyze.rules.healthy import RULE as HEALTHY

    @dataclass
    class LateCause(Rule):
        kind = "z_late_cause"
        final = True

        def evaluate(self, ctx) -> list[Finding]:
            return [finding(self.kind, [0], "a cause found late", [], "", 20.0, pct=20.0)]

    monkeypatch.setattr(rules, "registry", lambda: [HEALTHY, LateCause()])
    found = rules.find_all(context([rank(0), rank(1)]))
    assert [f.kind for f in found] == ["z_late_cause"]


def _steps(ms: list[float]) -> list[StepRow]:
    """A 2-rank job's steps: step 0 the warm-up, then `ms` (rank 1 a little faster each step)."""
    return [StepRow(step=i, ms_by_rank={"0": t, "1": t - 0.05}, spread_ms=0.05, warmup=i == 0)
            for i, t in enumerate([50.0, *ms])]


def _found_with(monkeypatch, found: list[Finding], steps: list[StepRow]) -> list[Finding]:
    """find_all's findings where the only rule finds `found`, on a 2-rank job with these steps."""
    import orchestrator.analyze.rules as rules
    from orchestrator.analyze.rules.base import Rule

    class Finds(Rule):
        kind = "finds"

        def evaluate(self, ctx) -> list[Finding]:
            return list(found)

    monkeypatch.setattr(rules, "registry", lambda: [Finds()])
    return rules.find_all(context([rank(0), rank(1)], steps=steps))


# Eight steps around 10 ms: median 10.0, absolute deviations 0, .2, .2, .1, .1, 0, .3, .3 (median
# 0.15), so sigma = 1.4826 * 0.15 = 0.22239 ms and a before/after measurement of 8 steps each tells
# apart a summed saving of 2 * 0.22239 * sqrt(16) = 1.779 ms or more.
EIGHT = [10.0, 10.2, 9.8, 10.1, 9.9, 10.0, 10.3, 9.7]


@pytest.mark.parametrize(("saving", "unprofiled", "err", "pct", "kept", "floor"), [
    (1.5, None, None, 3.0, "info", 1.779),  # low, under the 1.779 ms the steps' variation hides
    (2.0, None, None, 3.0, "low", 1.779),   # low, above it
    (30.0, 1.5, None, 3.0, "info", 1.779),  # the saving without the profiler is what is measured
    # ... an estimate: its error adds in quadrature, 2 * sqrt((1.779 / 2)^2 + 1^2) = 2.677 ms
    (30.0, 2.0, 1.0, 3.0, "info", 2.677),
    (30.0, 2.7, 1.0, 3.0, "low", 2.677),
    (1.5, None, None, 8.0, "medium", 1.779),  # medium and above: never tested (the cause makes the steps vary)
])
def test_a_low_saving_within_the_steps_own_variation_is_info(monkeypatch, saving, unprofiled, err, pct, kept,
                                                              floor) -> None:
    small = finding("small", [0], "a small cause", ["seen"], "fix it", saving, pct=pct, unprofiled_ms=unprofiled,
                    unprofiled_err_ms=err)
    (f,) = _found_with(monkeypatch, [small], _steps(EIGHT))
    assert f.severity == kept
    said = f"a before/after measurement of 8 steps each tells apart {floor} ms or more, so it is `info`"
    assert f.evidence[0].endswith(said) if kept == "info" else f.evidence == ["seen"]
    assert ("standard error of 1.0 ms" in f.evidence[0]) == (kept == "info" and err is not None)
    # Fewer than 4 complete steps have no spread to measure a small saving against: low is info
    # (the reason says so), medium and above stand.
    (f,) = _found_with(monkeypatch, [small], _steps(EIGHT[:3]))
    assert f.severity == ("medium" if pct >= 5 else "info")
    if pct < 5:
        assert f.evidence[0].endswith("over 3 analysed steps, of which 3 complete: under the 4 a spread needs, no "
                                      "before/after measurement of so few steps could tell it from what they vary "
                                      "by themselves, so it is `info`")


def test_a_low_finding_not_costed_in_time_is_never_info_for_the_steps_variation(monkeypatch) -> None:
    """Memory growing toward the GPU's capacity is low by the steps left, with no time cost."""
    growing = finding("growing", [0], "memory grows", ["seen"], "fix it", 0.0, severity="low")
    (f,) = _found_with(monkeypatch, [growing], _steps(EIGHT))
    assert (f.severity, f.evidence) == ("low", ["seen"])


def test_the_steps_variation_is_the_chosen_steps_own() -> None:
    """With --steps 0:8 the warm-up step is analysed too: nine steps, median 10.0, absolute
    deviations 40, 0, .2, .2, .1, .1, 0, .3, .3 (median 0.2), sigma 0.29652 ms, and a before/after
    measurement of 9 steps tells apart 2 * 0.29652 * sqrt(18) = 2.516 ms."""
    from orchestrator.analyze.measurable import step_noise
    from orchestrator.analyze.model_report import Window

    chosen = Window(source=["steps"], steps=[0, 8], gap_ms=1.0, note="", per_rank={})
    noise = step_noise(context([rank(0), rank(1)], steps=_steps(EIGHT), window=chosen).report)
    assert noise is not None and noise.steps == 9 and round(noise.floor_ms, 3) == 2.516
    noise = step_noise(context([rank(0), rank(1)], steps=_steps(EIGHT)).report)
    assert noise is not None and noise.steps == 8 and round(noise.floor_ms, 3) == 1.779


def test_a_ranks_last_step_counts_in_the_steps_but_not_in_their_spread() -> None:
    """A last step 30 ms long (it ends with its range, no next step to end it): n is 9, the
    spread the eight complete steps' (sigma 0.22239 ms): 2 * 0.22239 * sqrt(18) = 1.887 ms."""
    from orchestrator.analyze.measurable import step_noise

    steps = _steps([*EIGHT, 30.0])
    steps[-1] = steps[-1].model_copy(update={"complete": False})
    noise = step_noise(context([rank(0), rank(1)], steps=steps).report)
    assert noise is not None and noise.steps == 9 and round(noise.floor_ms, 3) == 1.887


def test_beside_a_larger_cause_the_steps_spread_is_no_noise_floor(monkeypatch) -> None:
    """A medium cause makes the steps vary by itself: the small one beside it stays low."""
    found = _found_with(monkeypatch, [finding("big", [1], "a larger cause", ["seen"], "fix it", 40.0, pct=8.0),
                                      finding("small", [0], "a small cause", ["seen"], "fix it", 1.5, pct=3.0)],
                        _steps(EIGHT))
    assert [(f.kind, f.severity) for f in found] == [("big", "medium"), ("small", "low")]


def test_a_root_that_held_nobody_up_in_the_replay_is_said_so_and_saves_nothing() -> None:
    """The critical path names rank 0 (40 ms a step on the path), but in the replay it never came
    alone last: its what-if was not replayed and saves 0, and the finding says why, at info."""
    from orchestrator.analyze.model_replay import Replay, ReplayStep, WhatIf

    steps = [ReplayStep(step=i, measured_ms=100.0, replayed_ms=100.0, error_pct=0.0) for i in range(1, 5)]
    replay = Replay(steps=steps, error_ms=0.01, error_pct=0.0, worst_step_pct=0.0,
                    whatifs=[WhatIf(what="rank 0", rank=0, steps=4, saving_ms=0.0, saving_pct=0.0, replayed=False)])
    (f,) = _run("straggler", context([rank(0), rank(1)], _cp([(1, 0, 40.0, None, [1]), (2, 0, 40.0, None, [1])]),
                                     replay=replay))
    assert (f.severity, f.cost_ms) == ("info", 0.0)
    assert ("in the replay of the job rank 0 held nobody up (never alone the last to start a synchronisation or to "
            "end a step): at its stage peers' pace the steps would take no less") in f.evidence
    assert not any(e.startswith("replayed with rank 0") for e in f.evidence)
