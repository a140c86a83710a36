"""Bytes and bandwidth per collective on real 2x H200 captures with known message
sizes (tests/fixtures/comm, see its README): orch's numbers against an independent
computation from the sizes the script sent and its own CUDA-event (nccl-tests style) timing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from orchestrator.analyze.build import build_report
from orchestrator.analyze.model_report import Report
from orchestrator.collect.collect import collect
from orchestrator.layout import Layout
from orchestrator.metrics.engine import Options
from orchestrator.render.nsys_args import profile_args
from orchestrator.report.diff import diff_reports
from orchestrator.spec.load import load_job

pytestmark = pytest.mark.replay

FX = Path(__file__).parent / "fixtures" / "comm"
TRUTH = json.loads((FX / "truth.json").read_text())
CAPTURES = ("nvlink", "socket", "ddp")
FACTOR = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0, "send_recv": 1.0}  # n=2


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Report]:
    out = {}
    for c in CAPTURES:
        d = tmp_path_factory.mktemp(c)
        (d / "in").mkdir()
        for f in FX.glob(f"{c}_r*_*.sqlite.gz"):
            shutil.copy(f, d / "in" / f.name)
        out[c] = build_report(collect([d / "in"], d / "run", layout=Layout(), workers=2).store, Options())
    return out


def _expected(capture: str) -> dict[tuple[str, int], tuple[int, int]]:
    """(kind, size bucket) -> (rank-instances, nccl-tests size S) from what the script sent."""
    exp: dict[tuple[str, int], list[int]] = {}
    world = TRUTH[capture]["world"]
    for c in TRUTH[capture]["calls_rank0_steps_after_first"]:
        s = c["bytes"] * (world if c["op"] in ("all_gather", "reduce_scatter") else 1)
        bucket = 1 << (s.bit_length() - 1)
        n = c["count"] * world  # every rank runs it (a send on one is the recv on the other)
        exp.setdefault((c["op"], bucket), [0, s])[0] += n
    return {k: (v[0], v[1]) for k, v in exp.items()}


@pytest.mark.parametrize("capture", ["nvlink", "socket"])
def test_bytes_per_collective_match_what_was_sent(reports: dict[str, Report], capture: str) -> None:
    comm = reports[capture].comm
    assert comm is not None and comm.size_source == "nccl_nvtx_payload"
    assert comm.sized_kernels == comm.comm_kernels
    got = {(k.kind, k.bucket_bytes): (k.instances, k.median_bytes) for k in comm.by_kind}
    for key, (n, s) in _expected(capture).items():
        assert key in got, key
        assert got[key] == (n, s), (key, got[key], (n, s))
    # every size the sweep sent, no more (the window holds only the steps after the first)
    assert set(got) == set(_expected(capture))


def test_bus_factor_and_algbw(reports: dict[str, Report]) -> None:
    for k in reports["nvlink"].comm.by_kind:
        assert k.median_busbw_gbps == pytest.approx(k.median_algbw_gbps * FACTOR[k.kind], rel=0.02, abs=0.02)


@pytest.mark.parametrize("capture", ["nvlink", "socket"])
def test_bandwidth_matches_cuda_event_timing(reports: dict[str, Report], capture: str) -> None:
    """Large all-reduces: orch's busbw (kernel minus waiting) within 15 % of the script's own
    nccl-tests-style timing (CUDA events around back-to-back all-reduces, outside the steps)."""
    ref = {r["bytes"]: r["busbw_GBps"] for r in TRUTH[capture]["nccl_tests"]}
    got = {k.bucket_bytes: k.median_busbw_gbps for k in reports[capture].comm.by_kind if k.kind == "all_reduce"}
    for size in (256 << 20, 1 << 30):
        assert got[size] == pytest.approx(ref[size], rel=0.15), (size, got[size], ref[size])


def test_nvlink_near_nccl_tests_expectations(reports: dict[str, Report]) -> None:
    """2x H200 NVLink 4: nccl-tests all-reduce busbw on 2 GPUs plateaus around 300-400 GB/s
    (of 450 per direction); the socket run stays at a few GB/s."""
    by = {(k.kind, k.bucket_bytes): k for k in reports["nvlink"].comm.by_kind}
    big = by[("all_reduce", 1 << 30)]
    assert 250 < big.median_busbw_gbps < 450 and 55 < big.pct_of_nominal < 100
    assert reports["nvlink"].comm.nominal.gbps_per_direction == 450
    sock = {(k.kind, k.bucket_bytes): k for k in reports["socket"].comm.by_kind}
    assert sock[("all_reduce", 1 << 30)].median_busbw_gbps < 10
    assert [s.scope for s in reports["nvlink"].comm.by_scope] == ["intra"]


def test_slow_link_found_on_socket_only(reports: dict[str, Report]) -> None:
    assert not [f for f in reports["nvlink"].findings if f.kind == "slow_link"]
    f = [f for f in reports["socket"].findings if f.kind == "slow_link"]
    assert f and f[0].severity == "high" and "NCCL_P2P_DISABLE" in f[0].fix and "nvlink -e" in f[0].fix


def test_diff_names_the_bandwidth_drop(reports: dict[str, Report]) -> None:
    d = diff_reports(reports["nvlink"], reports["socket"])
    names = {r["metric"] for r in d["regressions"] if r["rank"] == "all"}
    assert "busbw all_reduce 1 GiB (intra) GB/s" in names and "busbw send_recv 256 MiB (intra) GB/s" in names
    assert not [r for r in diff_reports(reports["nvlink"], reports["nvlink"])["regressions"]]


def test_ddp_buckets(reports: dict[str, Report]) -> None:
    """DDP with bucket_cap_mb 8: the reducer's 4 buckets of 8396800 bytes every step after the
    first (the first step all-reduces one 33587200-byte bucket, before DDP rebuilds them)."""
    t = TRUTH["ddp"]
    assert t["reducer_bucket_bytes"] == [8396800] * 4
    ar = [k for k in reports["ddp"].comm.by_kind if k.kind == "all_reduce"]
    assert len(ar) == 1 and ar[0].median_bytes == 8396800 and ar[0].size_bucket == "8 MiB"
    assert ar[0].instances == 2 * 4 * (t["steps"] - 1)


def test_profile_comm_sizes_renders_nvtx(tmp_path: Path) -> None:
    spec = tmp_path / "job.yaml"
    spec.write_text("name: c\ncluster: local-gpu\nlaunch: {script: t.py}\n"
                    "profile: {trace: [cuda, osrt], comm_sizes: true}\n")
    (tmp_path / "t.py").write_text("")
    args = profile_args(load_job(spec))
    assert "--trace=cuda,osrt,nvtx" in args


def test_store_keeps_nvtx_payload_and_old_exports_say_how(tmp_path: Path) -> None:
    """collect stores NCCL's NVTX payload (nvtx.payload); an export without payloads (the real
    fixtures: nsys 2025.3 export without --include-json) has no sizes, and the report says how to
    get them, with no missing-column note on the rank."""
    import duckdb

    (tmp_path / "in").mkdir()
    for f in FX.glob("ddp_r*_*.sqlite.gz"):
        shutil.copy(f, tmp_path / "in" / f.name)
    store = collect([tmp_path / "in"], tmp_path / "run", layout=Layout(), workers=2).store
    con = duckdb.connect(str(store), read_only=True)
    sizes = con.sql("SELECT DISTINCT json_extract_string(payload, '$.\"Message size [bytes]\"') FROM nvtx "
                    "WHERE domain = 'NCCL' AND text = 'ncclAllReduce' ORDER BY 1").fetchall()
    con.close()
    assert sizes == [("33587200",), ("8396800",)]  # the first step's one bucket, then DDP's 4 rebuilt ones
    real = Path(__file__).parent / "fixtures" / "real"
    (tmp_path / "old").mkdir()
    for f in real.glob("healthy_r*_*.sqlite.gz"):
        shutil.copy(f, tmp_path / "old" / f.name)
    res = collect([tmp_path / "old"], tmp_path / "run_old", layout=Layout(), workers=2)
    rep = build_report(res.store, Options())
    assert rep.comm is not None and rep.comm.size_source == "none" and rep.comm.by_kind == []
    assert "--include-json=true" in (rep.comm.hint or "")
    assert not [p for p in rep.problems if "jsonText" in (p.reason or "")]


def test_ddps_first_iteration_is_a_one_off_no_gap_finding_costs(reports: dict[str, Report]) -> None:
    """The DDP capture's second step (DDP's first iteration after the warm-up step: bucket rebuild)
    takes 4-5x the median step, and its GPU idle in `aten::add_` (about a quarter of the window)
    recurs in no other step: oneoff_gaps holds that step's idle, as plain sqlite3 over the
    export finds it (gaps of 1 ms or more beginning in `step 1`), and no cpu_gap finding costs it."""
    from orchestrator.api import open_store
    from tests.independent import export_rank, long_gaps_ms
    from tests.oracle import decompressed

    rep = reports["ddp"]
    assert not any(f.kind == "cpu_gap" for f in rep.findings), [(f.kind, f.cost_ms) for f in rep.findings]
    once = open_store(rep.store).view("oneoff_gaps").to_pylist()
    assert {(r["rank"], r["step"]) for r in once} == {(0, 1), (1, 1)}
    for f in FX.glob("ddp_r*_*.sqlite.gz"):
        rk = export_rank(f)
        with decompressed(str(f)) as export:
            want = long_gaps_ms(Path(export), "step 1", "step 2")
        got = sum(float(r["ns"]) for r in once if r["rank"] == rk) / 1e6
        assert got == pytest.approx(want, abs=0.01), (rk, got, want)
        assert want > 0.2 * next(r.window_ms for r in rep.ranks if r.rank == rk)
