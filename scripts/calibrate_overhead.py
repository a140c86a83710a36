"""Reproduce the capture-overhead constants of orchestrator/metrics/sql/67_capture_overhead.sql
from the real H100 captures in tests/fixtures/modern (nsys 2025.3.1, --trace=cuda,nvtx,osrt), and
the constant's error from those and the loops of tests/fixtures/loops.

Plain sqlite3 over the exports, no orch code, so that the constants are checked against an
independent reading. Per capture: the steady window of truth.json (steps 5..N, the same steps
the workload timed without nsys), the CUDA runtime calls starting in it and the
PROFILER_OVERHEAD time inside it; the observed cost per step is the step time under nsys minus
the median of the three runs without nsys (the README's table; the workload printed them).
The per-call cost is a least-squares fit through the origin over the loops whose step time the
CPU sets (GPU idle > 30 % of the window): where the GPU is the bottleneck, the added CPU time
hides behind GPU work and the step does not grow (ResNet: see the residuals).

The estimate's error is the root mean square of each loop's residual (estimate less observed)
over its per-call term: one relative standard deviation, which the report adds to what the steps
vary by themselves before it calls a saving without the profiler measurable
(analyze/measurable.py). It is taken over the CPU-bound loops (those the fit is over: where the
GPU sets the step, the call term is capped small and any noise is many times it) of the fit's
set and, out of sample, of the modern_loops.py loops of tests/fixtures/loops timed without nsys
under their own name in tests/fixtures/loops/timings.json (the same script and arguments on the
same kind of machine, the capture's own device call for most: that README says which). Their
window is the one the script's timer covers, from the end of the 5th `orch: optimizer.step` mark
to the end of the last. Left out: loops whose 3 unprofiled runs spread more than a quarter of
their median (the reference is noise), and the HF Trainer's, whose timer holds the Trainer's
once-a-run step (its first logging step creates NCCL's communicator, which nsys lengthens to
0.5-1 s) in its mean.

    python scripts/calibrate_overhead.py [--check]   # --check: exit 1 if an SQL constant drifts
"""

from __future__ import annotations

import argparse
import gzip
import json
import lzma
import re
import shutil
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODERN = ROOT / "tests" / "fixtures" / "modern"
LOOPS = ROOT / "tests" / "fixtures" / "loops"
SQL = ROOT / "orchestrator" / "metrics" / "sql" / "67_capture_overhead.sql"

# Step time without nsys, ms: median of the 3 runs in tests/fixtures/modern/README.md
# ("Step time without and with the profiler"), same machine, same script and arguments.
UNPROFILED_MS = {
    "gpt_compile_ro_graphtrace": 6.847, "gpt_compile_ro_nodetrace": 6.847,
    "gpt_eager_memusage": 10.660, "gpt_eager_nvtx": 10.660, "gpt_eager_emptycache_memusage": 23.202,
    "gpt_eager_keepoutputs_memusage": 14.604, "resnet18_pageable_nvtx": 32.103, "gpt_eager_accum4": 49.824,
}
# ... and the spread of those 3 runs (min, max), to show the noise the fit lives with.
UNPROFILED_RANGE_MS = {
    "gpt_compile_ro_graphtrace": (6.813, 9.804), "gpt_compile_ro_nodetrace": (6.813, 9.804),
    "gpt_eager_memusage": (10.472, 15.137), "gpt_eager_nvtx": (10.472, 15.137),
    "gpt_eager_emptycache_memusage": (21.830, 23.258), "gpt_eager_keepoutputs_memusage": (13.730, 17.846),
    "resnet18_pageable_nvtx": (29.365, 36.306), "gpt_eager_accum4": (46.473, 58.318),
}
CPU_BOUND_IDLE = 0.30  # GPU idle share of the window above which the CPU sets the step time
MAX_SPREAD = 0.25  # a validation loop's unprofiled runs: (slowest - fastest) / median at most this
WARMUP = 5  # modern_loops.py times the steps after its first 5 (--warmup)

LAUNCH = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cuGraphLaunch")
UNION_SQL = """
WITH ops AS (SELECT start AS s, "end" AS e FROM CUPTI_ACTIVITY_KIND_KERNEL {more}),
clipped AS (SELECT max(s, :w0) AS s, min(e, :w1) AS e FROM ops WHERE e > :w0 AND s < :w1),
ordered AS (SELECT s, e, max(e) OVER (ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS pm
            FROM clipped),
islands AS (SELECT s, e, sum(CASE WHEN pm IS NULL OR s > pm THEN 1 ELSE 0 END)
                         OVER (ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS g FROM ordered),
merged AS (SELECT min(s) AS gs, max(e) AS ge FROM islands GROUP BY g),
gaps AS (SELECT lead(gs) OVER (ORDER BY gs) - ge AS d FROM merged)
SELECT (SELECT coalesce(sum(ge - gs), 0) FROM merged),
       (SELECT coalesce(sum(d), 0) FROM gaps WHERE d < :gap_ns)
"""
GAP_NS = 1_000_000  # orch's default --gap-ms: GPU idle shorter than this is a launch gap


def measure(export: Path, w0: int, w1: int) -> dict[str, float]:
    """Counts inside [w0, w1) of one export: CUDA calls, launches, profiler time, GPU busy."""
    con = sqlite3.connect(export)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    w = {"w0": w0, "w1": w1}
    api = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE start >= :w0 AND start < :w1",
                      w).fetchone()[0]
    like = " OR ".join(f"s.value LIKE '{p}%'" for p in LAUNCH)
    launches = con.execute(f"SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
                           f"WHERE r.start >= :w0 AND r.start < :w1 AND ({like})", w).fetchone()[0]
    prof = 0
    if "PROFILER_OVERHEAD" in tables:
        prof = con.execute('SELECT coalesce(sum(min("end", :w1) - max(start, :w0)), 0) FROM PROFILER_OVERHEAD '
                           'WHERE "end" > :w0 AND start < :w1', w).fetchone()[0]
    more = "".join(f' UNION ALL SELECT start, "end" FROM {t}' for t in (
        "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET", "CUPTI_ACTIVITY_KIND_GRAPH_TRACE") if t in tables)
    busy, launch_gaps = con.execute(UNION_SQL.format(more=more), {**w, "gap_ns": GAP_NS}).fetchone()
    con.close()
    return {"api": api, "launches": launches, "profiler_ns": prof, "busy_ns": busy, "launch_gap_ns": launch_gaps}


def rows() -> list[dict]:
    truth = json.loads((MODERN / "truth.json").read_text())
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for gz in sorted(MODERN.glob("*_r0_*.sqlite.gz")):
            name = gz.name.split("_r0_")[0]
            plain = Path(tmp) / gz.name[:-3]
            with gzip.open(gz) as a, open(plain, "wb") as b:
                shutil.copyfileobj(a, b)
            st = truth[gz.name]["steady"]
            m = measure(plain, st["start_ns"], st["end_ns"])
            out.append(_row(name, m, st["steps"], st["end_ns"] - st["start_ns"], st["step_ms"], UNPROFILED_MS[name],
                            UNPROFILED_RANGE_MS[name]))
    return out


def _row(loop: str, m: dict[str, float], n: int, window_ns: int, step_ms: float, unprofiled_ms: float,
         unprofiled_range_ms: tuple[float, float]) -> dict:
    """One loop's row: its counts in the window per step, and the cost nsys was seen to add."""
    return {"loop": loop, "steps": n, "step_ms": step_ms, "unprofiled_ms": unprofiled_ms,
            "unprofiled_range_ms": unprofiled_range_ms, "observed_ms": step_ms - unprofiled_ms,
            "api_per_step": m["api"] / n, "launches_per_step": m["launches"] / n,
            "profiler_ms_per_step": m["profiler_ns"] / n / 1e6, "gpu_idle": 1 - m["busy_ns"] / window_ns,
            "launch_gap_ms_per_step": m["launch_gap_ns"] / n / 1e6}


def _marks(export: Path) -> list[int]:
    """The ends of orch's `orch: optimizer.step` loop marks, in order."""
    con = sqlite3.connect(export)
    ends = [e for (e,) in con.execute(
        'SELECT e."end" FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId '
        "WHERE coalesce(e.text, s.value) = 'orch: optimizer.step' ORDER BY e.\"end\"")]
    con.close()
    return ends


def loop_rows() -> tuple[list[dict], list[str]]:
    """The validation loops (module docstring), as rows(): and what was left out, and why."""
    timed = json.loads((LOOPS / "timings.json").read_text())
    out, left = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for xz in sorted(LOOPS.glob("*_r0_*.sqlite.xz")):
            name = xz.name.split("_r0_")[0]
            runs = timed.get(name)
            if runs is None or name.startswith("hf_"):
                left.append(f"{name}: {'the HF Trainer' if runs else 'no timing under its name'}")
                continue
            med = statistics.median(runs)
            if (max(runs) - min(runs)) / med > MAX_SPREAD:
                left.append(f"{name}: unprofiled runs {min(runs):.1f}-{max(runs):.1f} ms")
                continue
            plain = Path(tmp) / xz.name[:-3]
            with lzma.open(xz) as a, open(plain, "wb") as b:
                shutil.copyfileobj(a, b)
            ends = _marks(plain)
            n = len(ends) - WARMUP
            w0, w1 = ends[WARMUP - 1], ends[-1]
            m = measure(plain, w0, w1)
            plain.unlink()
            out.append(_row(name, m, n, w1 - w0, (w1 - w0) / n / 1e6, med, (min(runs), max(runs))))
    return out, left


def fit(data: list[dict]) -> float:
    """Per-call cost in ns: least squares through the origin over the CPU-bound loops of
    (observed - profiler time) per step against CUDA calls per step."""
    pts = [(r["api_per_step"], r["observed_ms"] - r["profiler_ms_per_step"]) for r in data
           if r["gpu_idle"] > CPU_BOUND_IDLE]
    return 1e6 * sum(x * y for x, y in pts) / sum(x * x for x, _ in pts)


def sql_constant() -> int:
    m = re.search(r"MACRO overhead_call_ns\(\) AS (\d+)", SQL.read_text())
    return int(m.group(1)) if m else -1


def sql_error() -> float:
    m = re.search(r"MACRO overhead_call_err\(\) AS ([0-9.]+)", SQL.read_text())
    return float(m.group(1)) if m else -1.0


def estimate(r: dict) -> tuple[float, float]:
    """The SQL's estimate per step, ms: profiler time + the call term (the rounded constant,
    capped by the launch gaps), and that call term."""
    calls = min(sql_constant() * r["api_per_step"] / 1e6, r["launch_gap_ms_per_step"])
    return r["profiler_ms_per_step"] + calls, calls


def relative_error(data: list[dict]) -> float:
    """The call term's relative error: the root mean square of residual / call term over the loops."""
    rel = [(est - r["observed_ms"]) / calls for r in data for est, calls in [estimate(r)] if calls > 0]
    return (sum(x * x for x in rel) / len(rel)) ** 0.5


def _table(data: list[dict]) -> None:
    print("| loop | CUDA calls/step | launches/step | launch gaps ms/step | GPU idle % | under nsys ms "
          "| without ms (range) | observed +ms | estimated +ms | residual ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in data:
        est, _ = estimate(r)
        lo, hi = r["unprofiled_range_ms"]
        print(f"| {r['loop']} | {r['api_per_step']:.0f} | {r['launches_per_step']:.0f} "
              f"| {r['launch_gap_ms_per_step']:.2f} | {100 * r['gpu_idle']:.0f} "
              f"| {r['step_ms']:.3f} | {r['unprofiled_ms']:.3f} ({lo:.2f}-{hi:.2f}) | {r['observed_ms']:.2f} "
              f"| {est:.2f} | {est - r['observed_ms']:+.2f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="fail if the SQL module's constants are not the fit's")
    args = ap.parse_args()
    data = rows()
    a = fit(data)
    print(f"per CUDA call: {a:.0f} ns (fit over {sum(r['gpu_idle'] > CPU_BOUND_IDLE for r in data)} CPU-bound loops)")
    _table(data)
    loops, left = loop_rows()
    print(f"\nout of sample: {len(loops)} loops of tests/fixtures/loops (left out: {'; '.join(left)})")
    _table(loops)
    have, have_err = sql_constant(), sql_error()
    cpu = [r for r in data + loops if r["gpu_idle"] > CPU_BOUND_IDLE]
    err = relative_error(cpu)
    print(f"the call term's relative error (root mean square of residual / call term) over the {len(cpu)} CPU-bound "
          f"loops of both sets: {err:.2f} (the fitted ones alone {relative_error(data):.2f}, every loop "
          f"{relative_error(data + loops):.2f}); refitted over them the constant would be {fit(cpu):.0f} ns a call")
    print(f"SQL constants overhead_call_ns(): {have}, overhead_call_err(): {have_err}")
    drift = []
    if abs(have - round(a, -2)) > 100:
        drift.append(f"the fit gives {round(a, -2):.0f} ns a call")
    if abs(have_err - round(err, 2)) > 0.01:
        drift.append(f"the residuals give a relative error of {err:.2f}")
    if args.check and drift:
        print("drift: " + "; ".join(drift), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
