"""Truth of the real GPU captures in tests/fixtures/real, h200, gpu_e2e, comm and dp2pp2-gpipe (each
folder's README says how they were made). The cause and its ranks are the workload's arguments as
the READMEs give them; steps are counted with plain sqlite3. A saving is given only where a healthy
twin of the same job exists from the same machine (the same GPU UUIDs, within a minute): the slow
run's step period minus the twin's, measured on the GPU, times the steps analysed.

A step's period here is measured on the GPU: step N ends where the last GPU operation (kernel,
memcpy, memset) launched between its range's start and the next step's start ends, on any thread
of the process (PyTorch launches backward from its autograd thread); the period of step N is
that end minus step N-1's. Loops without a per-step sync (tests/fixtures/h200's lab_train.py)
let the CPU run ahead of the GPU, so their NVTX ranges' own spacing is not the step's time."""

from __future__ import annotations

import bisect
import json
import re
import sqlite3
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.truth import FIXTURES, Truth, opened, peaks, range_starts, step_count

# (LIKE, the form every range it matches must have) of each workload's step ranges
STEP = ("step %", r"^step \d+$")                # lab_train.py, train.py, pipeline_lm.py, vit_ddp_eval.py, comm_bench.py
RESNET = ("Step % Start", r"^Step \d+ Start$")  # resnet_ddp.py (the tutorial's ranges; 0..5 in each epoch)
ITERATION = ("iteration %", r"^iteration \d+$")  # the dp2pp2-gpipe job


@dataclass
class Case:
    folder: str          # under tests/fixtures
    glob: str            # its exports
    about: str
    cause: str
    root: list[int]
    root_how: str        # where the cause and root come from
    steps: tuple[str, str] | None  # (LIKE, regex of every range it matches) or None: no step ranges
    steps_none_how: str = ""
    layout: str | None = None
    twin: str | None = None        # the case id of its healthy twin


def _c(folder: str, job: str, glob: str, about: str, cause: str, root: list[int], root_how: str,
       steps: tuple[str, str] | None, **kw) -> tuple[str, Case]:
    return f"{folder.split('/')[0]}-{job}", Case(folder, glob, about, cause, root, root_how, steps, **kw)


REAL = "planted: tests/fixtures/real/README.md's script and arguments (scripts/workloads/)"
H200 = "planted: tests/fixtures/h200/README.md's table (capture/lab_train.py --slow-rank / --heavy-stage)"
E2E = "planted: tests/fixtures/gpu_e2e/README.md's table (scripts/examples/train.py arguments)"
COMM = "tests/fixtures/comm/README.md: a communication benchmark, nothing planted that loses time"
DP2PP2 = "planted: tests/fixtures/dp2pp2-gpipe/README.md (rank 1 = stage 0, dp index 1, sleeps in data_load)"

CASES = dict([
    _c("real", "resnet_nw2", "resnet_nw2_r*.sqlite.gz",
       "ResNet-50 DDP (the tutorial's trainer) on 2 H200, JPEG decoding in a DataLoader of 2 workers "
       "re-forked each epoch: too few for either rank (rank 1 waits the longest)",
       "input", [0, 1], REAL + ": --num-workers 2 on every rank", RESNET),
    _c("real", "resnet_nw0", "resnet_nw0_r*.sqlite.gz",
       "ResNet-50 DDP (the tutorial's trainer) on 2 H200, num_workers=0: each rank's main process "
       "decodes every batch",
       "input", [0, 1], REAL + ": --num-workers 0 on every rank", RESNET),
    _c("real", "item_sync", "item_sync_r*.sqlite.gz",
       "GPT-2 (4 layers, 512 wide) DDP on 2 H200 printing loss.item() every step on every rank: a host "
       "sync planted in every step, costing little of it (~4 %, real/truth.json); the small model is "
       "also launch-bound",
       "host-sync", [0, 1], REAL + ": print(loss.item()) every step on every rank (--log-every 1)", None,
       steps_none_how="the job opens no step NVTX ranges (gpt2_ddp.py --steps 14; tests/oracle.py counts 14 "
                      "optimizer kernel bursts)"),
    _c("real", "healthy", "healthy_r*.sqlite.gz",
       "GPT-2 (12 layers, 1024 wide, bf16) DDP on 2 H200, GPU-bound, nothing planted",
       "none", [], REAL + ": no fault", None,
       steps_none_how="the job opens no step NVTX ranges (gpt2_ddp.py --steps 12; tests/oracle.py counts 12 "
                      "kernel bursts)"),
    _c("real", "gpipe_m4", "gpipe_m4_r*.sqlite.gz",
       "decoder LM, torch.distributed.pipelining GPipe pp=2 on 2 H200, 4 microbatches; stage 1 holds "
       "the 32000-way LM head and the loss: the heavier stage",
       "stage", [1], REAL + ": pipeline_lm.py's split (stage 1: 2 blocks + norm + LM head + loss)", STEP,
       layout="pp=2"),
    _c("real", "1f1b_m8", "1f1b_m8_r*.sqlite.gz",
       "decoder LM, torch.distributed.pipelining 1F1B pp=2 on 2 H200, 8 microbatches; stage 1 holds "
       "the 32000-way LM head and the loss: the heavier stage",
       "stage", [1], REAL + ": pipeline_lm.py's split (stage 1: 2 blocks + norm + LM head + loss)", STEP,
       layout="pp=2"),
    _c("real", "ddp_slowrank", "ddp_slowrank_r*.sqlite.gz",
       "ViT-B/16 DDP on 2 H200: rank 0 alone computes batch metrics on the CPU after each step and "
       "evaluates 6 batches every 4 steps, between its step ranges; rank 1 waits in the all-reduces",
       "cpu", [0], REAL + ": vit_ddp_eval.py's bookkeeping on the main process (rank 0) only", STEP),
    _c("h200/ddp_straggler", "ddp_straggler", "*.sqlite.gz",
       "lab_train.py DDP dp=2 on 2 H200, 4 microbatches a step: rank 1 sleeps 25 ms in every data_load "
       "(4 a step); rank 0's all-reduces wait for it",
       "input", [1], H200 + ": --slow-rank 1 --slow-ms 25", STEP, twin="h200-ddp_capture"),
    _c("h200/pp_imbalance", "pp_imbalance", "*.sqlite.gz",
       "lab_train.py GPipe pp=2 on 2 H200, 4 microbatches: stage 1 holds twice the layers of stage 0",
       "stage", [1], H200 + ": --heavy-stage 1 (--heavy-factor 2)", STEP, layout="pp=2"),
    _c("h200/ddp_capture", "ddp_capture", "*.sqlite.gz",
       "lab_train.py DDP dp=2 on 2 H200, healthy, capture limited to steps 4..8 (cudaProfilerApi)",
       "none", [], H200 + ": no fault", STEP),
    _c("gpu_e2e", "ddp", "ddp_r*.sqlite.gz",
       "train.py DDP dp=2 on 2 H200, 4 microbatches a step: rank 1 sleeps 25 ms in every data_load "
       "(4 a step); capture steps 3..8",
       "input", [1], E2E + ": --slow-rank 1 --slow-ms 25", STEP, twin="gpu_e2e-ok"),
    _c("gpu_e2e", "pp", "pp_r*.sqlite.gz",
       "train.py 2-stage pipeline pp=2 on 2 H200, 4 microbatches: stage 1 holds twice the layers",
       "stage", [1], E2E + ": --pp 2 --heavy-stage 1 (--heavy-factor 2)", STEP, layout="pp=2"),
    _c("gpu_e2e", "ok", "ok_r*.sqlite.gz",
       "train.py DDP dp=2 on 2 H200, 4 microbatches a step, nothing planted",
       "none", [], E2E + ": no fault", STEP),
    _c("comm", "nvlink", "nvlink_r*.sqlite.gz",
       "comm_bench.py on 2 H200 over NVLink: a sweep of collectives and send/recv of known sizes; a "
       "benchmark, nothing planted that loses time",
       "none", [], COMM, STEP),
    _c("comm", "socket", "socket_r*.sqlite.gz",
       "comm_bench.py on 2 H200 with NCCL forced onto its socket transport over loopback: a slow link "
       "between the two ranks",
       "slow-link", [0, 1], "planted: tests/fixtures/comm/README.md (NCCL_P2P_DISABLE, NCCL_SHM_DISABLE, "
                            "NCCL_IB_DISABLE, NCCL_SOCKET_IFNAME=lo on both ranks)", STEP),
    _c("comm", "ddp", "ddp_r*.sqlite.gz",
       "comm_bench.py DDP on 2 H200: 8 x Linear(1024, 1024), bucket_cap_mb=8, nothing planted",
       "none", [], COMM, STEP),
    _c("dp2pp2-gpipe", "slow", "slow_*.sqlite.xz",
       "GPipe pp=2 x dp=2 on 4 H200, 4 microbatches: rank 1 (stage 0, dp 1) sleeps 20 ms in data_load "
       "every iteration; its pipeline peer (3) and DP peer (0) wait, and rank 2 waits for rank 3",
       "input", [1], DP2PP2 + ": time.sleep(0.02) on rank 1", ITERATION, layout="pp=2,dp=2", twin="dp2pp2-gpipe-ok"),
    _c("dp2pp2-gpipe", "ok", "ok_*.sqlite.xz",
       "GPipe pp=2 x dp=2 on 4 H200, 4 microbatches, nothing planted (the slow run's twin)",
       "none", [], DP2PP2 + ": no sleep", ITERATION, layout="pp=2,dp=2"),
])

# tests/oracle.py's and comm_bench.py's own step counts (truth.json beside the exports): checked.
ORACLE_STEPS = {"real": lambda d, job: d[job]["ranks"]["0"]["steps_found"], "comm": lambda d, job: d[job]["steps"]}


def _exports(c: Case) -> list[str]:
    files = sorted((FIXTURES / c.folder).glob(c.glob))
    if not files:
        raise FileNotFoundError(f"no exports {c.glob} in {c.folder}")
    return [str(f.relative_to(FIXTURES)) for f in files]


def _names_match(con: sqlite3.Connection, like: str, regex: str) -> None:
    """Every range LIKE `like` (case-insensitive) is a step range of the workload's spelling."""
    for (text,) in con.execute("SELECT coalesce(e.text, s.value) FROM NVTX_EVENTS e LEFT JOIN StringIds s "
                               "ON s.id = e.textId WHERE coalesce(e.text, s.value) LIKE ?", (like,)):
        if not re.match(regex, text):
            raise ValueError(f"range {text!r} matches {like!r} but is no step")


def _gpu_ends(con: sqlite3.Connection, starts: list[int]) -> list[int | None]:
    """Per step, the end of the last GPU operation launched (on any thread) between its start and
    the next step's start; the last step's runs to the end of the capture."""
    tables = {t for (t,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    ops = " UNION ALL ".join(f"SELECT correlationId, globalPid, end FROM {t}" for t in
                             ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY",
                              "CUPTI_ACTIVITY_KIND_MEMSET") if t in tables)
    ends: list[int | None] = [None] * len(starts)
    for launched, end in con.execute(
            f"SELECT r.start, g.end FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN ({ops}) g "
            "ON g.correlationId = r.correlationId AND g.globalPid = (r.globalTid / 16777216) * 16777216 "
            "WHERE r.start >= ?", (starts[0],)):
        i = bisect.bisect_right(starts, launched) - 1
        ends[i] = end if ends[i] is None else max(ends[i], end)
    return ends


def _gpu_periods(cons: dict[int, sqlite3.Connection], like: str) -> dict[int, float]:
    """Per step after the first (its index in the capture), ms from the previous step's GPU end to
    its own, the median over the ranks."""
    per: dict[int, list[float]] = {}
    for con in cons.values():
        ends = _gpu_ends(con, range_starts(con, like))
        for n in range(1, len(ends)):
            a, b = ends[n - 1], ends[n]
            if a is None or b is None:
                raise ValueError(f"step {n} or the one before launched no GPU work")
            per.setdefault(n, []).append((b - a) / 1e6)
    return {n: statistics.median(v) for n, v in per.items()}


def _machine(cons: dict[int, sqlite3.Connection]) -> tuple[frozenset[str], int]:
    """The GPUs the capture saw (their UUIDs) and when its first rank's session started (ns)."""
    uuids = frozenset(u for con in cons.values() for (u,) in con.execute("SELECT uuid FROM TARGET_INFO_GPU"))
    start = min(con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()[0]
                for con in cons.values())
    return uuids, start


def _kernels(cons: dict[int, sqlite3.Connection], like: str) -> frozenset[tuple]:
    """The compute kernels launched in the steps after the first: name and launch shape (NCCL's
    left out)."""
    return frozenset(row for con in cons.values() for row in con.execute(
        "SELECT DISTINCT s.value, k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, k.blockZ "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
        "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId "
        "AND k.globalPid = (r.globalTid / 16777216) * 16777216 "
        "WHERE s.value NOT LIKE 'nccl%' AND r.start >= ?", (range_starts(con, like)[1],)))


def cases() -> list[Truth]:
    out: dict[str, Truth] = {}
    periods: dict[str, dict[int, float]] = {}
    machine: dict[str, tuple[frozenset[str], int]] = {}
    kernels: dict[str, frozenset[tuple]] = {}
    oracle: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for case, c in CASES.items():
            spec: dict = {"exports": _exports(c)}
            if c.layout:
                spec["layout"] = c.layout
            d = Path(tmp) / case
            d.mkdir()
            with opened(spec, d) as cons:
                t = Truth(case=case, about=c.about, input=spec, cause=c.cause, root=c.root,
                          how={"cause": c.root_how, "root": c.root_how})
                if c.steps:
                    like, regex = c.steps
                    for con in cons.values():
                        _names_match(con, like, regex)
                    t.steps = step_count(cons, like)
                    t.how["steps"] = (f"plain sqlite3: the NVTX ranges LIKE '{like}' (all of the form "
                                      f"/{regex}/) on each rank, the same count on every rank")
                    fam, job = case.split("-", 1)
                    if fam in ORACLE_STEPS:
                        if fam not in oracle:
                            oracle[fam] = json.loads((FIXTURES / fam / "truth.json").read_text())
                        theirs = ORACLE_STEPS[fam](oracle[fam], job)
                        if theirs != t.steps:
                            raise ValueError(f"{case}: {t.steps} steps, {fam}/truth.json says {theirs}")
                        t.how["steps"] += f"; {fam}/truth.json says the same"
                    periods[case] = _gpu_periods(cons, like)
                    kernels[case] = _kernels(cons, like)
                else:
                    t.how["steps"] = c.steps_none_how
                machine[case] = _machine(cons)
                tables = [{n for (n,) in con.execute("SELECT name FROM sqlite_master")} for con in cons.values()]
                if all("CUDA_GPU_MEMORY_USAGE_EVENTS" in ts for ts in tables):
                    t.peak_bytes = peaks(cons)
                    t.how["peak_bytes"] = ("plain sqlite3: CUDA_GPU_MEMORY_USAGE_EVENTS, allocations minus "
                                           "frees on the rank's device")
                else:
                    t.how["peak_bytes"] = "none: the exports hold no CUDA_GPU_MEMORY_USAGE_EVENTS"
            out[case] = t
    for case, c in CASES.items():
        t = out[case]
        if c.twin:
            slow, twin = periods[case], periods[c.twin]
            (gpus, t0), (twin_gpus, t1) = machine[case], machine[c.twin]
            if gpus != twin_gpus:
                raise ValueError(f"{case}: its twin {c.twin} ran on other GPUs")
            if kernels[case] != kernels[c.twin]:
                raise ValueError(f"{case}: its twin {c.twin} ran other kernels: "
                                 f"{sorted(kernels[case] ^ kernels[c.twin])[:5]}")
            analysed = len(slow)  # the steps after the first
            t.saving_ms = round((statistics.median(slow.values()) - statistics.median(twin.values())) * analysed, 1)
            t.how["saving_ms"] = (
                f"plain sqlite3: (the median GPU step period of this run's steps after the first - the median "
                f"of its healthy twin {c.twin}'s steps after the first) x the {analysed} steps after the first "
                f"this capture holds; a step's GPU period: the end of the last GPU op launched from its start "
                f"to the next step's start minus the previous step's, the median over the ranks; the twin ran "
                f"the same job (the same compute kernels and launch shapes in the steps after the first) on "
                f"the same GPUs (TARGET_INFO_GPU's UUIDs), its capture started "
                f"{abs(t1 - t0) / 1e9:.0f} s {'after' if t1 > t0 else 'before'} this one")
            if c.twin in ("h200-ddp_capture", "gpu_e2e-ok"):
                t.how["saving_ms"] += ("; the twin was profiled without --pytorch=autograd-nvtx and GPU metrics, "
                                       "so the saving also holds their cost on this run's critical path")
        else:
            t.how["saving_ms"] = "none: no healthy twin of this job from the same machine"
    return list(out.values())
