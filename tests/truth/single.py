"""Truth of the single-process captures: tests/fixtures/modern (README there: one H100, current
training loops of `modern_loops.py`, each export whole) and the CPU pair of tests/fixtures/stats.

Modern: optimizer steps are counted from the one `lpnorm_cleanup` kernel `clip_grad_norm_` launches
per optimizer step (as the fixture's own truth.py does, whose truth.json is checked here), and
from the NVTX `step N` ranges where the code opens them. Every modern export ran on the same GPU in
one device call (the exports' GPU UUID says so), so the loop without a planted cause is a measured
twin: what a fix saves is the difference of the median step periods (one `lpnorm_cleanup`'s end to
the next) times the steps after the first two (the first period holds AdamW's and torch.compile's
warm-up)."""

from __future__ import annotations

import csv
import itertools
import json
import re
import sqlite3
import statistics
import tempfile
from pathlib import Path

from tests.truth import FIXTURES, Truth, opened, peaks, range_starts, step_count

MODERN = FIXTURES / "modern"
MARKS = ("SELECT k.\"end\" FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
         "WHERE s.value = 'lpnorm_cleanup' ORDER BY k.start")
LOSS = ("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
        "WHERE s.value = 'nll_loss_forward_reduce_cuda_kernel_2d'")
# ms the loop's host spends in cudaFree / cudaMalloc while GPU work it launched before the call is
# still pending (what a device synchronization would wait for), and in all.
LAUNCHED = ("CREATE TEMP TABLE IF NOT EXISTS launched AS SELECT r.start AS launch, k.\"end\" AS kend "
            "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId",
            "CREATE INDEX IF NOT EXISTS temp.launched_at ON launched (launch, kend)")
ALLOC_WAIT = """
WITH k AS (SELECT launch, kend FROM temp.launched),
f AS (SELECT r.start, r."end", (SELECT max(kend) FROM k WHERE k.launch < r.start) AS pending
      FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId
      WHERE s.value LIKE 'cudaFree\\_v%' ESCAPE '\\' OR s.value LIKE 'cudaMalloc\\_v%' ESCAPE '\\')
SELECT count(*), sum("end" - start) / 1e6, sum(max(0, min("end", coalesce(pending, 0)) - start)) / 1e6 FROM f"""

LAUNCH = ("the eager GPT is launch-bound (nothing planted for it): {busy} % of its steady window GPU-busy, "
          "kernels of a median {kmed} us; the compiled loop (CUDA graphs, same GPU and call) runs a "
          "micro-batch in {twin_ms} ms, this one in {ms} (median step period / micro-batches)")

# stem -> (about, cause, root, twin stem or None)
CASES = {
    "gpt_compile_ro_graphtrace": (
        "GPT 27.4M on 1 H100, torch.compile reduce-overhead (2 CUDA graphs a step), graph-level trace, 40 "
        "steps, no NVTX; the fixed loop, nothing planted", "none", [], None),
    "gpt_compile_ro_nodetrace": (
        "gpt_compile_ro_graphtrace's loop with --cuda-graph-trace=node; nothing planted", "none", [], None),
    "gpt_eager_memusage": (
        "the eager twin of the compiled GPT (no compile), --cuda-memory-usage, 40 steps, no NVTX; nothing "
        "planted (the flat-memory control), the loop is launch-bound", "launch", [0], None),
    "gpt_eager_emptycache_memusage": (
        "the eager GPT with torch.cuda.empty_cache() after every optimizer step (allocator churn: 38 "
        "cudaMalloc and 38 cudaFree a step), --cuda-memory-usage", "allocator-churn", [0], "gpt_eager_memusage"),
    "gpt_eager_keepoutputs_memusage": (
        "the eager GPT keeping every step's (logits, loss): device memory grows 128 MiB a step, "
        "--cuda-memory-usage (its loop launch-bound as its control's)", "memory-growth", [0], None),
    "gpt_eager_accum4": (
        "the eager GPT with 4 micro-batches of gradient accumulation per optimizer step, 20 optimizer steps, "
        "no NVTX; nothing planted, launch-bound", "launch", [0], None),
    "gpt_eager_nvtx": (
        "the eager GPT with NVTX `step N` ranges, 40 steps; nothing planted, launch-bound", "launch", [0],
        "gpt_compile_ro_graphtrace"),
    "resnet18_pageable_nvtx": (
        "ResNet-18 on 1 H100, DataLoader(num_workers=2, pin_memory=False): a blocking .to(device) of 38.5 MB "
        "a batch from pageable memory (--no-pin), NVTX `step N`, 30 steps", "pageable-copy", [0], None),
}

CAUSE_HOW = {
    "gpt_eager_emptycache_memusage": (
        "planted: --empty-cache. {n} cudaMalloc/cudaFree calls take {total} ms of the loop thread, of which "
        "{pending} ms with GPU work still pending (plain sqlite3): the GPU is already idle when they run, so "
        "they cost host time, not a device synchronization ('host-sync' rejected)"),
}

HOW = {
    "root": "planted: the workload's arguments (modern/README.md); a single process is rank 0",
    "steps": "plain sqlite3: optimizer steps, one `lpnorm_cleanup` kernel each (clip_grad_norm_), "
             "= truth.json's optimizer_steps",
    "peak_bytes": "plain sqlite3: CUDA_GPU_MEMORY_USAGE_EVENTS, device, array and static allocations minus frees "
                  "(truth.json's peak_bytes also counts the 3 pinned host allocations, 65,540 bytes more)",
    "saving_ms": "plain sqlite3: (median period between consecutive `lpnorm_cleanup` ends - {twin}'s) x the "
                 "{n} periods after the first; {twin}: same GPU UUID, same device call{note}",
}

TWIN_NOTE = {
    "gpt_eager_memusage": ", same nsys options (--cuda-memory-usage): the loop without empty_cache",
    "gpt_compile_ro_graphtrace": (", nsys's default graph trace, no NVTX ranges: the loop compiled with "
                                  "CUDA graphs, the launch-bound loop's fix; it also fuses kernels, which "
                                  "is counted in"),
}


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


def _periods(con: sqlite3.Connection) -> list[float]:
    """ms from one optimizer step's `lpnorm_cleanup` end to the next's."""
    return [(b - a) / 1e6 for a, b in itertools.pairwise(e for (e,) in con.execute(MARKS))]


def _busy_pct(con: sqlite3.Connection) -> float:
    """GPU busy share (kernels, memcpy, memset) from the fifth step's end to the last's (the steady
    window of the fixture's truth.py), union of intervals."""
    ends = [e for (e,) in con.execute(MARKS)]
    w0, w1 = ends[4], ends[-1]
    rows = sorted(con.execute(
        "SELECT max(start, :w0), min(\"end\", :w1) FROM (SELECT start, \"end\" FROM CUPTI_ACTIVITY_KIND_KERNEL "
        "UNION ALL SELECT start, \"end\" FROM CUPTI_ACTIVITY_KIND_MEMCPY UNION ALL SELECT start, \"end\" FROM "
        "CUPTI_ACTIVITY_KIND_MEMSET) WHERE \"end\" > :w0 AND start < :w1", {"w0": w0, "w1": w1}))
    busy, hi = 0, w0
    for s, e in rows:
        if e > hi:
            busy += e - max(s, hi)
            hi = e
    return round(100 * busy / (w1 - w0), 1)


def _median_kernel_us(con: sqlite3.Connection) -> float:
    return round(statistics.median(d for (d,) in con.execute(
        "SELECT \"end\" - start FROM CUPTI_ACTIVITY_KIND_KERNEL")) / 1e3, 1)


def _modern(tmp: Path) -> list[Truth]:
    expected = json.loads((MODERN / "truth.json").read_text())
    files = {stem: f"modern/{next(MODERN.glob(f'{stem}_r0_*.sqlite.gz')).name}" for stem in CASES}
    out = []
    for stem, (about, cause, root, twin) in CASES.items():
        spec = {"exports": [files[stem]]}
        with opened(spec, tmp) as cons:
            (con,) = cons.values()
            have = _tables(con)
            steps = len(con.execute(MARKS).fetchall())
            want = expected[files[stem].split("/")[-1]]
            if steps != want["optimizer_steps"]:
                raise ValueError(f"{stem}: {steps} optimizer steps, truth.json {want['optimizer_steps']}")
            t = Truth(case=f"modern-{stem}", about=about, input=spec, cause=cause, root=root, steps=steps,
                      how={k: HOW[k] for k in ("root", "steps")})
            if "NVTX_EVENTS" in have and (nvtx := range_starts(con, "step %")):
                if len(nvtx) != steps:
                    raise ValueError(f"{stem}: {len(nvtx)} NVTX steps, {steps} optimizer steps")
                t.how["steps"] += f", = its {len(nvtx)} NVTX `step N` ranges"
            micro = max(1, (loss := con.execute(LOSS).fetchone()[0]) // steps)
            if loss > steps:
                t.how["steps"] += f"; {loss} nll_loss forwards = {loss // steps} micro-batches per optimizer step"
            if "CUDA_GPU_MEMORY_USAGE_EVENTS" in have:
                t.peak_bytes = peaks(cons)
                t.how["peak_bytes"] = HOW["peak_bytes"]
            if stem in CAUSE_HOW:
                for sql in LAUNCHED:
                    con.execute(sql)
                n, total, pending = con.execute(ALLOC_WAIT).fetchone()
                t.how["cause"] = CAUSE_HOW[stem].format(n=n, total=round(total, 1), pending=round(pending, 1))
            mine = _periods(con)
            uuid = con.execute("SELECT uuid FROM TARGET_INFO_GPU").fetchall()
            busy, kmed = _busy_pct(con), _median_kernel_us(con)
        if cause == "launch" or twin:
            ref = twin or "gpt_compile_ro_graphtrace"
            with opened({"exports": [files[ref]]}, tmp) as tcons:
                (tcon,) = tcons.values()
                if tcon.execute("SELECT uuid FROM TARGET_INFO_GPU").fetchall() != uuid:
                    raise ValueError(f"{stem}: twin {ref} ran on another GPU")
                theirs = _periods(tcon)
            if cause == "launch":
                t.how["cause"] = LAUNCH.format(busy=busy, kmed=kmed, twin_ms=round(statistics.median(theirs[1:]), 2),
                                               ms=round(statistics.median(mine[1:]) / micro, 2))
            if twin:
                n = min(len(mine), len(theirs)) - 1
                t.saving_ms = round((statistics.median(mine[1:n + 1]) - statistics.median(theirs[1:n + 1])) * n, 1)
                t.how["saving_ms"] = HOW["saving_ms"].format(twin=twin, n=n, note=TWIN_NOTE[twin])
        out.append(t)
    return out


STATS = FIXTURES / "stats"


def _cpu(tmp: Path) -> Truth:
    """The nsys 2022.4 CPU pair: a torch CPU loop, 8 steps of data_load / forward / backward /
    optimizer; rank 1 sleeps 20 ms more in data_load (stats/README.md)."""
    files = sorted(STATS.glob("cpu_r*.sqlite.gz"))
    spec = {"exports": [f"stats/{f.name}" for f in files]}
    with opened(spec, tmp) as cons:
        steps = step_count(cons, "step %")
        csv_steps = set()
        for f in files:
            rows = csv.DictReader((STATS / f.name.replace(".sqlite.gz", "_nvtxsum.csv")).open())
            csv_steps.add(sum(int(r["Instances"]) for r in rows if re.fullmatch(r"step \d+", r["Range"])))
        if csv_steps != {steps}:
            raise ValueError(f"stats cpu: {steps} steps in sqlite, nsys stats says {csv_steps}")
        load = {r: statistics.mean((e - s) / 1e6 for s, e in c.execute(
            "SELECT e.start, e.\"end\" FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
            "WHERE coalesce(e.text, s.value) = 'data_load'")) for r, c in cons.items()}
        # each process's steps on one clock (its session's UTC start + t): do they overlap at all?
        at = {}
        for r, c in cons.items():
            (utc,) = c.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
            (last,) = c.execute("SELECT max(\"end\") FROM NVTX_EVENTS").fetchone()
            at[r] = (utc + range_starts(c, "step %")[0], utc + last)
    apart = at[0][1] < at[1][0] or at[1][1] < at[0][0]
    return Truth(
        case="stats-cpu", input=spec, cause="input", root=[1], steps=steps,
        about="a torch CPU loop (nsys 2022.4, nvtx+osrt), 8 steps of data_load/forward/backward/optimizer as 2 "
              "ranks; rank 1 sleeps 20 ms more in data_load" + (" (the two processes ran one after the other, "
                                                                "never waiting for each other)" if apart else ""),
        how={"root": "planted: stats/README.md (rank 1 sleeps 20 ms more in data_load); plain sqlite3: mean "
                     "data_load range " + ", ".join(f"rank {r} {v:.2f} ms" for r, v in load.items()),
             "steps": "plain sqlite3: the `step N` NVTX ranges on each rank, = the nsys stats nvtxsum CSVs",
             "saving_ms": "not judged: no twin run without the sleep"})


def cases() -> list[Truth]:
    with tempfile.TemporaryDirectory() as tmp:
        return [*_modern(Path(tmp)), _cpu(Path(tmp))]
