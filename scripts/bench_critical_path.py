"""The critical path at scale: N synthetic ranks made from ONE real export (scripts/bench_data.py's
generator: per-rank clock skew, shift and jitter), one rank's work delayed by D in a few steps
(tests/plant.py: plain sqlite3 UPDATEs on copies), collected with the map/reduce collect and
analysed. Reports the wall time and peak RSS of the analysis (each phase in its own child
process), the seconds of the wait-graph and critical-path SQL, and whether the planted rank is
named first with its phase and every other rank as its victim.

    python scripts/bench_critical_path.py [--ranks 2048] [--delay-ms 80] [--steps 5 6 7]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench import run_phase
from bench_data import CACHE, REPO, synthetic_dataset

from tests.plant import LABEL, plant

SQL = ("57_wait_graph.sql", "59_critical_path.sql", "61_replay.sql", "(wall)")  # the SQL files timed
SOURCE = REPO / "tests" / "fixtures" / "h200" / "ddp_capture" / "ddp_capture_r0_vm.2142.sqlite.gz"


def phase_collect(d: Path, out: Path) -> dict:
    from rich.console import Console

    from orchestrator.collect.collect import collect_parts
    from orchestrator.layout import Layout

    res = collect_parts([d], out, layout=Layout(), workers=2, console=Console(stderr=True, quiet=True))
    return {"ok_ranks": len(res.ok_ranks)}


def phase_analyze(store: Path) -> dict:
    from orchestrator.analyze.build import build_report
    from orchestrator.metrics.engine import Options
    from orchestrator.timings import TIMINGS

    TIMINGS.reset(True)
    rep = build_report(store, Options())
    sql = {n.split(": ", 1)[1]: round(s, 2)
           for n, s, _ in TIMINGS.rows()
           if n.startswith("analyze: ") and n.endswith(SQL)}
    top = next((f for f in rep.findings if f.kind == "straggler"), None)
    steps = rep.critical_path.steps if rep.critical_path else []
    return {"sql_s": sql, "straggler": top.model_dump() if top else None,
            "replay_error_pct": rep.replay.error_pct if rep.replay else None,
            "root_steps": [(s.step, s.root, s.root_phase) for s in steps]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2048)
    ap.add_argument("--delay-ms", type=float, default=80.0)
    ap.add_argument("--steps", type=int, nargs="+", default=[5, 6, 7])
    ap.add_argument("--rank", type=int, default=None, help="the delayed rank (default: ranks // 3)")
    a = ap.parse_args()
    root = a.rank if a.rank is not None else a.ranks // 3
    src = synthetic_dataset(a.ranks, 1, SOURCE)
    work = Path(tempfile.mkdtemp(prefix=f"orch-cp-{a.ranks}-", dir=CACHE))
    try:
        d = work / "in"
        shutil.copytree(src, d)
        files = {int(f.name.split("_r")[1].split("_")[0]): f for f in d.glob("*.sqlite")}
        t = time.perf_counter()
        plant(files, [root], a.steps, int(a.delay_ms * 1e6), "ncclDevKernel_AllReduce%")
        plant_s = time.perf_counter() - t
        c = run_phase(phase_collect, d, work / "run")
        z = run_phase(phase_analyze, work / "run" / "profile.duckdb")
        f = z["straggler"] or {}
        row = {"ranks": a.ranks, "delayed_rank": root, "delay_ms": a.delay_ms, "steps": a.steps,
               "plant_s": round(plant_s, 1), "collect_s": round(c["s"], 1), "collect_rss_mb": round(c["rss_mb"]),
               "analyze_s": round(z["s"], 1), "analyze_rss_mb": round(z["rss_mb"]), "sql_s": z["sql_s"],
               "named_first": f.get("ranks") == [root] and f"`{LABEL}`" in f.get("title", ""),
               "victims_all_others": f.get("victims") == [r for r in sorted(files) if r != root],
               "cost_ms": f.get("cost_ms"), "expected_cost_ms": len(a.steps) * a.delay_ms,
               "replay_error_pct": z["replay_error_pct"],
               "title": f.get("title"),
               "planted_steps_rooted": [s for s in z["root_steps"] if s[0] in a.steps]}
        print(json.dumps(row, indent=1))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
