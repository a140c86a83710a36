"""Benchmark: `orch analyze` (collect + report) against the C-level and Python read floors and a
pandas baseline, on REAL H200 exports and on synthetic ranks made from one of them for scale.

    python scripts/bench.py [--ranks 8 32 128 512] [--runs 3] [--repeat 1] [--source PATH]

Every phase runs in a child process (peak RSS is the child's, imports are paid inside the
timed phase, as by the CLI). On a shared machine timings are noisy, so each dataset's phases
run `--runs` times ALTERNATELY (floor, orch, floor, orch, ...) and the medians are compared:
the ratios are side by side in one run, never across runs. Writes docs/benchmarks.md and
docs/benchmarks.json with the machine and the date. Datasets are cached under
~/.cache/orch-bench (outside the repo). The GPU-machine half of the benchmark (export formats,
`nsys recipe`) is scripts/bench_recipe.sh: see docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import multiprocessing as mp
import os
import platform
import queue
import resource
import shutil
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_data as bd


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _child(fn, args, q) -> None:  # runs in a fresh process: its own peak RSS
    """Wall seconds, and CPU seconds (user + system, all threads): on a shared machine the
    CPU time moves far less with other people's load than the wall time does."""
    t, c = time.perf_counter(), _cpu()
    info = fn(*args)
    q.put({"s": time.perf_counter() - t, "cpu_s": _cpu() - c,
           "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **info})


def run_phase(fn, *args) -> dict:
    q: mp.Queue = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=_child, args=(fn, args, q))
    p.start()
    while True:  # a child that dies (import error, OOM kill) must not hang the benchmark
        try:
            res = q.get(timeout=1)
            break
        except queue.Empty:
            if not p.is_alive():
                raise RuntimeError(f"benchmark phase {fn.__name__} died (exit {p.exitcode})") from None
    p.join()
    return res


def _store_phase(fn):
    """A phase that needs a fresh store folder per run."""
    def run(d: Path) -> dict:
        store = Path(tempfile.mkdtemp(prefix="orch-bench-store-"))
        try:
            return run_phase(fn, d, store)
        finally:
            shutil.rmtree(store, ignore_errors=True)
    return run


def _analyze_only(d: Path) -> dict:
    """Collect (untimed), then time the report alone."""
    store = Path(tempfile.mkdtemp(prefix="orch-bench-store-"))
    try:
        run_phase(bd.phase_ingest, d, store)
        return run_phase(bd.phase_analyze, store)
    finally:
        shutil.rmtree(store, ignore_errors=True)


# Timed in the first round only: pandas takes minutes at 128 ranks (once is enough against a
# >= 10x goal); ingest and analyze alone only say where orch's time goes.
ONCE = ("pandas", "ingest", "analyze")


def measure(d: Path, runs: int, pandas: bool, baseline: Path | None = None) -> dict:
    """Each phase `runs` times, interleaved; medians (and the peak RSS over runs)."""
    phases = {
        "floor_c": lambda: run_phase(bd.phase_floor_c, d, bd.SOURCES),
        "floor_py": lambda: run_phase(bd.phase_floor_py, d, bd.SOURCES),
        "floor_py5": lambda: run_phase(bd.phase_floor_py, d, bd.FLOOR5),
        "orch": lambda: _store_phase(bd.phase_orch)(d),
        "ingest": lambda: _store_phase(bd.phase_ingest)(d),
        "analyze": lambda: _analyze_only(d),
    }
    if baseline:
        phases["orch_before"] = lambda: _store_phase(lambda dd, st: bd.phase_orch_in(str(baseline), dd, st))(d)
    if pandas:
        phases["pandas"] = lambda: run_phase(bd.phase_pandas, d)
    got: dict[str, list[dict]] = {k: [] for k in phases}
    for _ in range(runs):
        for k, fn in phases.items():
            if k in ONCE and got[k]:
                continue
            got[k].append(fn())
    out = {}
    for k, rs in got.items():
        out[k] = {"s": statistics.median(r["s"] for r in rs), "runs": [round(r["s"], 3) for r in rs],
                  "cpu_s": statistics.median(r["cpu_s"] for r in rs),
                  "rss_mb": max(r["rss_mb"] for r in rs),
                  **{x: v for x, v in rs[0].items() if x not in ("s", "rss_mb")}}
    o = out["orch"]["s"]
    out["ratios"] = {"orch/floor_c": o / out["floor_c"]["s"], "orch/floor_py": o / out["floor_py"]["s"],
                     "orch/floor_py5": o / out["floor_py5"]["s"],
                     "pandas/orch": out["pandas"]["s"] / o if pandas else None,
                     "before/floor_c": out["orch_before"]["s"] / out["floor_c"]["s"] if baseline else None,
                     "before/floor_py": out["orch_before"]["s"] / out["floor_py"]["s"] if baseline else None,
                     "cpu orch/floor_c": out["orch"]["cpu_s"] / out["floor_c"]["cpu_s"],
                     "cpu orch/floor_py": out["orch"]["cpu_s"] / out["floor_py"]["cpu_s"],
                     "cpu before/floor_c": out["orch_before"]["cpu_s"] / out["floor_c"]["cpu_s"] if baseline else None}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="*", default=[8, 32, 128, 512],
                    help="synthetic datasets (none: the real ones only)")
    ap.add_argument("--runs", type=int, default=3, help="alternating runs per phase (medians)")
    ap.add_argument("--repeat", type=int, default=1, help="repeat each synthetic rank's steps to grow it")
    ap.add_argument("--source", type=Path, default=bd.default_source())
    ap.add_argument("--pandas-max", type=int, default=128, help="skip the (slow) pandas baseline above this")
    ap.add_argument("--no-real", action="store_true", help="skip the real-export datasets")
    ap.add_argument("--real", nargs="+", default=["all", "pp_imbalance", "resnet_nw2", "resnet_ddp4"],
                    help="real datasets: all (every export as one job's ranks), or a job's name")
    ap.add_argument("--baseline", type=Path, help="another orch tree (e.g. `git archive main`) timed as `before`")
    ap.add_argument("--baseline-label", default="", help="what --baseline is, for the document (e.g. main at abc1234)")
    ap.add_argument("--out", type=Path, default=bd.REPO / "docs")
    a = ap.parse_args()
    if a.ranks and a.pandas_max >= min(a.ranks) and importlib.util.find_spec("pandas") is None:
        # Found now, not after minutes of other phases.
        raise SystemExit("bench: the pandas baseline needs pandas: pip install -e '.[bench]' "
                         "(or --pandas-max 0 to skip it)")
    for tree in (bd.REPO, a.baseline):
        if tree:
            bd.compile_tree(tree)
    sets: list[tuple[str, Path, int]] = []
    if not a.no_real:
        for name in a.real:
            job = None if name == "all" else name
            d = bd.real_dataset(job)
            if d is not None:
                n = len(list(d.glob("*.sqlite")))
                sets.append((f"real: {f'all {n} H200 exports' if job is None else job}", d, n))
    for n in a.ranks:
        sets.append((f"synthetic x{n}", bd.synthetic_dataset(n, a.repeat, a.source), n))
    results = []
    for label, d, n in sets:
        row = {"dataset": label, "ranks": n, "bytes": sum(f.stat().st_size for f in d.glob("*.sqlite")),
               **measure(d, a.runs if n < 512 else min(a.runs, 2), n <= a.pandas_max and label.startswith("syn"),
                          a.baseline)}
        results.append(row)
        print(json.dumps({"dataset": label, "ratios": row["ratios"], "orch": row["orch"]["runs"],
                          "floor_c": row["floor_c"]["runs"], "floor_py": row["floor_py"]["runs"]}), flush=True)
    write(results, a)


def _machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({cpu}), {mem:.0f} GiB RAM, {platform.system()} {platform.release()}"


def write(results: list[dict], a: argparse.Namespace) -> None:
    import bench_doc

    a.out.mkdir(parents=True, exist_ok=True)
    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": _machine(),
            "runs": a.runs, "repeat": a.repeat, "source": a.source.name, "ranks": a.ranks,
            "baseline_label": a.baseline_label}
    (a.out / "benchmarks.json").write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    text = bench_doc.render(results, meta)
    (a.out / "benchmarks.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
