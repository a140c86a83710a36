"""Scale benchmark of the map/reduce collect (`orch collect --parts`): synthetic ranks made
from ONE real export (scripts/bench.py's generator: per-rank clock skew, shift, jitter).

    python scripts/bench_scale.py [--ranks 128 512 2048] [--source PATH.sqlite[.gz]] [--workers 2]
        [--map-stats --json docs/scale_map_stats.json]

Per N, each phase in a fresh child process (peak RSS is that process's; the map's pool
workers are reported separately): (1) map: every rank -> Parquet parts in a local pool of
`--workers` processes (the same function a Slurm array task runs); (2) reduce: the parts ->
the DuckDB store (a re-run with every part fresh: discover + freshness checks + reduce);
(3) analysis of the store (every metric of the report). Plus `nsys export` cost of a real
.nsys-rep made here with nsys, when nsys exists. `--map-stats`: every map also computes its
rank's per-rank statistics (store/map_tables.py), which the analysis then takes instead of
computing them. Writes docs/scale.json and prints a Markdown table for docs/scale.md.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import run_phase
from bench_data import CACHE, REPO
from bench_data import synthetic_dataset as dataset

from orchestrator.duckdb_memory import memory_limit


def default_source() -> Path:
    """A small real GPU export (H200, nsys 2025.3): ~0.5 MB, ~3,700 events per rank."""
    return REPO / "tests" / "fixtures" / "h200" / "ddp_capture" / "ddp_capture_r0_vm.2142.sqlite.gz"


def phase_collect(d: Path, out: Path, workers: int, map_stats: bool = False) -> dict:
    from rich.console import Console

    from orchestrator.collect.collect import collect_parts
    from orchestrator.layout import Layout

    res = collect_parts([d], out, layout=Layout(), workers=workers, console=Console(stderr=True, quiet=True),
                        summaries=map_stats)
    n = len(list(d.glob("*.sqlite")))
    assert len(res.ok_ranks) == n, [m.probe.error or m.notes for m in res.bad[:3]]
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"mapped": res.mapped, "reused": res.reused, "worker_rss_mb": kids}


def phase_analyze(out: Path) -> dict:
    from orchestrator.analyze.build import build_report
    from orchestrator.metrics.engine import Options

    rep = build_report(out / "profile.duckdb", Options())
    return {"ranks": len(rep.ranks)}


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def parts_stats(out: Path) -> dict:
    metas = [json.loads(f.read_text()) for f in (out / "parts" / "reports").glob("*.json")]
    rows = sum(sum(m["rows"].values()) for m in metas)
    parquet = sum(m["part_bytes"] for m in metas)
    return {"events": rows, "parquet_bytes": parquet, "meta_bytes": du(out / "parts" / "reports"),
            "files": sum(len(m["files"]) for m in metas), "store_bytes": (out / "profile.duckdb").stat().st_size,
            "extract_s_mean": sum(m["seconds"]["extract"] + m["seconds"]["probe"] for m in metas) / len(metas),
            "summarize_s_mean": sum(m["seconds"]["summarize"] for m in metas) / len(metas)}


def bench_export() -> dict | None:
    """`nsys export` of one real report made here (CPU: nvtx + osrt), 3 times."""
    nsys = shutil.which("nsys")
    if not nsys:
        return None
    work = Path(tempfile.mkdtemp(prefix="orch-scale-export-"))
    prog = work / "p.py"
    prog.write_text("import nvtx, time, os\nfor i in range(3000):\n    nvtx.push_range(f'step {i}')\n"
                    "    os.stat('/')\n    time.sleep(0.0001)\n    nvtx.pop_range()\n")
    subprocess.run([nsys, "profile", "--trace=nvtx,osrt", "--sample=none", "--cpuctxsw=none", "-o",
                    str(work / "rep"), sys.executable, str(prog)], capture_output=True, check=True)
    rep = work / "rep.nsys-rep"
    times = []
    for i in range(3):
        t = time.perf_counter()
        subprocess.run([nsys, "export", "--type", "sqlite", "--force-overwrite", "true", "--output",
                        str(work / f"e{i}.sqlite"), str(rep)], capture_output=True, check=True)
        times.append(time.perf_counter() - t)
    out = {"report_mb": rep.stat().st_size / 1e6, "export_mb": (work / "e0.sqlite").stat().st_size / 1e6,
           "s": min(times)}
    out["s_per_mb"] = out["s"] / out["report_mb"]
    shutil.rmtree(work, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[128, 512, 2048])
    ap.add_argument("--source", type=Path, default=default_source())
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path, default=REPO / "docs" / "scale.json")
    ap.add_argument("--map-stats", action="store_true", help="the maps compute the per-rank statistics too")
    a = ap.parse_args()
    results = []
    for n in a.ranks:
        d = dataset(n, 1, a.source)
        out = Path(tempfile.mkdtemp(prefix=f"orch-scale-{n}-", dir=CACHE))
        m = run_phase(phase_collect, d, out, a.workers, a.map_stats)  # map (all) + reduce
        r = run_phase(phase_collect, d, out, a.workers, a.map_stats)  # reduce (every part fresh)
        z = run_phase(phase_analyze, out)
        st = parts_stats(out)
        src = sum(f.stat().st_size for f in d.glob("*.sqlite"))
        row = {"ranks": n, "map_reduce_s": m["s"], "reduce_s": r["s"], "map_s": m["s"] - r["s"],
               "reduce_rss_mb": r["rss_mb"], "map_driver_rss_mb": m["rss_mb"], "map_worker_rss_mb": m["worker_rss_mb"],
               "analyze_s": z["s"], "analyze_rss_mb": z["rss_mb"], "export_bytes_per_rank": src / n,
               "parquet_bytes_per_rank": st["parquet_bytes"] / n, "meta_bytes_per_rank": st["meta_bytes"] / n,
               "parquet_bytes_per_event": st["parquet_bytes"] / st["events"], "events": st["events"],
               "files": st["files"], "store_bytes_per_rank": st["store_bytes"] / n,
               "extract_s_per_rank": st["extract_s_mean"], "summarize_s_per_rank": st["summarize_s_mean"],
               "reused_on_rerun": r["reused"]}
        results.append(row)
        print(json.dumps(row), flush=True)
        shutil.rmtree(out, ignore_errors=True)
    export = bench_export()
    base = results[0]
    doc = {"source": str(a.source.name), "workers": a.workers, "cores": os.cpu_count(), "map_stats": a.map_stats,
           "duckdb_memory": memory_limit(), "results": results,
           "export": export,
           "scaling": {f"{r['ranks']}/{base['ranks']}": {"ranks_x": r["ranks"] / base["ranks"],
                                                        "time_x": r["map_reduce_s"] / base["map_reduce_s"]}
                       for r in results[1:]}}
    a.json.write_text(json.dumps(doc, indent=2) + "\n")
    print("| ranks | events | map s | reduce s | map+reduce s | x vs first | reduce peak RSS MB | map worker RSS MB "
          "| analyze s | export B/rank | Parquet B/rank | Parquet B/event | store B/rank |")
    print("|" + "---|" * 13)
    for r in results:
        print(f"| {r['ranks']:,} | {r['events']:,} | {r['map_s']:.1f} | {r['reduce_s']:.1f} | {r['map_reduce_s']:.1f} "
              f"| {r['map_reduce_s'] / base['map_reduce_s']:.1f} | {r['reduce_rss_mb']:.0f} | "
              f"{r['map_worker_rss_mb']:.0f} | {r['analyze_s']:.1f} | {r['export_bytes_per_rank']:,.0f} | "
              f"{r['parquet_bytes_per_rank']:,.0f} | {r['parquet_bytes_per_event']:.2f} | "
              f"{r['store_bytes_per_rank']:,.0f} |")
    if export:
        print(f"\nnsys export: {export['report_mb']:.2f} MB report -> {export['export_mb']:.2f} MB SQLite in "
              f"{export['s']:.2f} s ({export['s_per_mb']:.2f} s/MB, startup included)")


if __name__ == "__main__":
    main()
