"""Root cause across ranks on a DP2 x PP2 job whose timelines are known by construction
(synthetic nsys-schema exports): stage-0 rank 1 loads data 30 ms longer every step. Its DP peer
(rank 0) waits for it in the stage-0 all-reduce; its pipeline peer (rank 3) receives activations
30 ms late, so rank 3 reaches the stage-1 all-reduce last and rank 2 waits for rank 3. Rank 3 is
busy computing while rank 2 waits: only the differential waiting since the last collective shows
it is a victim. Megatron order: stage = rank // (tp*dp) -> ranks 0, 1 stage 0; 2, 3 stage 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.analyze.build import build_report
from orchestrator.collect.collect import collect
from orchestrator.layout import Layout
from orchestrator.metrics.engine import Options
from tests.synthetic import MS, Export

pytestmark = pytest.mark.fast

STEPS, PERIOD = 10, 130 * MS
DATA = {0: 5 * MS, 1: 35 * MS}  # stage-0 data loading per step; rank 1 is slow
PEER = {2: 0, 3: 1}  # stage-1 rank -> its stage-0 pipeline peer (same dp index)
P2P, AR, GEMM = "ncclDevKernel_SendRecv", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "sm90_gemm_kernel"


LAUNCH = 50_000  # the CPU's time per launch: it runs ahead of the GPU, as an eager PyTorch loop does


def _k(e: Export, cpu: list[int], start: int, end: int, name: str) -> None:
    """A kernel launched at the CPU's own pace (cpu[0], then LAUNCH later for the next), never after
    it starts: a rank that waits for a peer has its next kernels queued already, not launched late."""
    e.kernel(cpu[0], start, end, name, stream=9 if name.startswith("nccl") else 7)
    cpu[0] += LAUNCH


def _build(d: Path) -> Path:
    d.mkdir()
    for rank in range(4):
        e = Export(d / f"dpp_1_r{rank}_h.{100 + rank}.sqlite", rank)
        for i in range(STEPS):
            t = i * PERIOD
            e.nvtx(t, t + 125 * MS, f"step {i}")
            if rank in DATA:
                dl = DATA[rank]
                e.nvtx(t, t + dl, "data_load")
                cpu = [t + dl - LAUNCH]  # it launches once its data is loaded
                _k(e, cpu, t + dl, t + dl + 20 * MS, GEMM)  # forward
                _k(e, cpu, t + dl + 20 * MS, t + dl + 21 * MS, P2P)  # send activations
                _k(e, cpu, t + dl + 21 * MS, t + dl + 62 * MS, P2P)  # recv grads: waits for stage 1
                _k(e, cpu, t + dl + 62 * MS, t + dl + 82 * MS, GEMM)  # backward
                _k(e, cpu, t + dl + 82 * MS, t + max(DATA.values()) + 84 * MS, AR)  # DP all-reduce (stage 0)
            else:
                dl, cpu = DATA[PEER[rank]], [t + 1 * MS - LAUNCH]
                _k(e, cpu, t + 1 * MS, t + dl + 21 * MS, P2P)  # recv activations: waits for stage 0
                _k(e, cpu, t + dl + 21 * MS, t + dl + 61 * MS, GEMM)  # forward + backward
                _k(e, cpu, t + dl + 61 * MS, t + dl + 62 * MS, P2P)  # send grads
                _k(e, cpu, t + dl + 62 * MS, t + max(DATA.values()) + 64 * MS, AR)  # DP all-reduce (stage 1)
        e.close()
    return d


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("dpp")
    res = collect([_build(d / "in")], d / "run", layout=Layout.parse("dp=2,pp=2"), workers=1)
    return build_report(res.store, Options())


def test_the_slow_stage0_rank_is_the_root(report) -> None:
    (f,) = [f for f in report.findings if f.kind == "straggler"]
    # Rank 3 (its activations came late) and rank 2 (waited for rank 3) are victims like rank 0.
    assert f.ranks == [1] and f.victims == [0, 2, 3]
    assert "`data_load`" in f.title
    # Rank 3 starts the stage-1 all-reduce last every step, yet it is a victim, not a cause.
    assert {s.rank for s in report.stragglers} == {1, 3}
    assert any(e.startswith("rank 3 started last in") and "a victim, not the cause" in e for e in f.evidence)
    # By construction every measured step (1..9) is 30 ms longer: what rank 1 puts on the
    # critical path, once (rank 0 and rank 3 wait for the same 30 ms).
    assert f.cost_ms == pytest.approx(9 * 30, abs=0.5)


def test_waiting_split_by_kind(report) -> None:
    r = {x.rank: x for x in report.ranks}
    assert r[0].nccl_wait_ms == pytest.approx(9 * 30, abs=0.5)  # DP all-reduce, stage 0
    assert r[2].nccl_wait_ms == pytest.approx(9 * 30, abs=0.5)  # DP all-reduce, stage 1
    # Stage-1 rank 3 waits 30 ms longer for its activations than rank 2 does.
    assert r[3].p2p_wait_ms - r[2].p2p_wait_ms == pytest.approx(9 * 30, abs=0.5)
