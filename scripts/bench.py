"""Benchmark: orch collect + report at 8..512 ranks against the physical floor and a pandas
baseline, on synthetic ranks made from a REAL export in ../shared/fixtures.

    python scripts/bench.py [--ranks 8 32 128 512] [--repeat 1] [--source PATH.sqlite[.gz]]

For each N, in one run and on the same data, each phase runs in a child process (peak RSS is
the child's): (1) floor: a plain sequential sqlite3 read of every row of the kernel, memcpy,
memset, runtime and NVTX tables; (2) orch ingest into DuckDB; (3) orch analysis (every metric
of the report); (4) a pandas implementation of the per-rank overlap/idle/gap metrics, the way
HTA and the nsys recipes compute them. Plus (5) `nsys export` of real reports with 1 vs 2
workers where nsys exists. Writes docs/benchmarks.md and docs/benchmarks.json.
Datasets are cached under ~/.cache/orch-bench (outside the repo).
"""

from __future__ import annotations

import argparse
import gzip
import itertools
import json
import multiprocessing as mp
import os
import random
import resource
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("ORCH_BENCH_CACHE", Path.home() / ".cache" / "orch-bench"))
FLOOR_TABLES = ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"]
TIMED = {"CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
         "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS", "OSRT_API", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"}


def default_source() -> Path:
    case = REPO.parent / "shared" / "fixtures" / "h200-nsys2025.3" / "ddp_straggler"
    return case / "ddp_straggler_r1_vm.2402.sqlite.gz"


def make_template(source: Path, repeat: int, dest: Path) -> None:
    """One rank's export, optionally with its steps repeated `repeat` times (shifted copies)."""
    if source.suffix == ".gz":
        with gzip.open(source, "rb") as fi, open(dest, "wb") as fo:
            shutil.copyfileobj(fi, fo)
    else:
        shutil.copy(source, dest)
    con = sqlite3.connect(dest)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    con.execute("DROP TABLE IF EXISTS GPU_METRICS")  # the floor does not read it either
    if repeat > 1:
        lo, hi = con.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
        span = hi - lo + 1_000_000
        for t in TIMED & tables:
            cols = [r[1] for r in con.execute(f"PRAGMA table_info({t})")]
            sel = ", ".join(
                f"{c} + {{k}} * {span}" if c in ("start", "end") else
                (f"{c} + {{k}} * 100000000" if c == "correlationId" else c) for c in cols)
            for k in range(1, repeat):
                con.execute(f"INSERT INTO {t} SELECT {sel.format(k=k)} FROM {t} WHERE start <= {hi}")
    con.commit()
    con.execute("VACUUM")
    con.close()


def make_rank(template: Path, rank: int, world: int, dest: Path, rng: random.Random) -> None:
    """A copy with its own rank, session start (clock skew) and a few ms of jitter."""
    shutil.copy(template, dest)
    con = sqlite3.connect(dest)
    skew = rng.randint(-2_000_000_000, 2_000_000_000)
    con.execute("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = utcEpochNs + ?", [skew])
    shift = -skew + rng.randint(0, 3_000_000)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    for t in TIMED & tables:
        con.execute(f"UPDATE {t} SET start = start + ?, end = end + ?", [shift, shift])
    con.execute("UPDATE META_DATA_CAPTURE SET value = ? WHERE value LIKE 'RANK=%'", [f'RANK="{rank}"'])
    con.execute("UPDATE META_DATA_CAPTURE SET value = ? WHERE value LIKE 'WORLD_SIZE=%'", [f'WORLD_SIZE="{world}"'])
    con.commit()
    con.close()


def dataset(n: int, repeat: int, source: Path) -> Path:
    d = CACHE / f"{source.name.split('.')[0]}-x{repeat}" / f"n{n}"
    if (d / ".complete").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    tpl = d.parent / "template.sqlite"
    if not tpl.exists():
        make_template(source, repeat, tpl)
    rng = random.Random(n)
    for r in range(n):
        make_rank(tpl, r, n, d / f"bench_1_r{r}_host{r // 8}.{1000 + r}.sqlite", rng)
    (d / ".complete").touch()
    return d


# ---------------------------------------------------------------- phases (each in a child)


def phase_floor(d: Path) -> dict:
    rows = 0
    for f in sorted(d.glob("*.sqlite")):
        con = sqlite3.connect(f)
        for t in FLOOR_TABLES:
            cur = con.execute(f"SELECT * FROM {t}")
            while chunk := cur.fetchmany(65536):
                rows += len(chunk)
        con.close()
    return {"rows": rows}


def phase_ingest(d: Path, store_dir: Path) -> dict:
    from rich.console import Console

    from orchestrator.collect.collect import collect
    from orchestrator.collect.identity import Layout

    res = collect([d], store_dir, layout=Layout(), workers=2, console=Console(stderr=True, quiet=True))
    assert len(res.ok_ranks) == len(list(d.glob("*.sqlite"))), res.bad[:3]
    return {"engine": res.engine}


def phase_analyze(store_dir: Path) -> dict:
    from orchestrator.analyze.engine import Options
    from orchestrator.analyze.report import build_report

    rep = build_report(store_dir / "profile.duckdb", Options())
    return {"ranks": len(rep["ranks"]), "idle_pct_rank0": rep["ranks"][0]["gpu_idle_pct"]}


def phase_pandas(d: Path) -> dict:
    """Per rank DataFrames and Python interval merges, as HTA / the nsys recipes do it."""
    import re

    import pandas as pd

    step_re = re.compile(r"^(?:[Ss]tep|[Ii]teration)[ _#:]*(\d+)$")
    out = {}
    for f in sorted(d.glob("*.sqlite")):
        con = sqlite3.connect(f)
        sid = pd.read_sql("SELECT id, value FROM StringIds", con).set_index("id")["value"]
        k = pd.read_sql("SELECT start, end, correlationId, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL", con)
        k["name"] = k["shortName"].map(sid)
        m = pd.concat([pd.read_sql(f"SELECT start, end, correlationId FROM {t}", con)
                       for t in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")])
        rt = pd.read_sql("SELECT start, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME", con)
        nv = pd.read_sql("SELECT start, end, globalTid, text, textId, domainId FROM NVTX_EVENTS "
                         "WHERE eventType IN (59, 60) AND end IS NOT NULL", con)
        con.close()
        nv["text"] = nv["text"].fillna(nv["textId"].map(sid))
        steps = nv[(nv["domainId"].fillna(0) == 0) & nv["text"].str.match(step_re.pattern, na=False)].copy()
        steps["n"] = steps["text"].str.extract(step_re.pattern, expand=False).astype(int)
        rt["step"] = None
        for s in steps.itertuples():  # launch -> step, one step range at a time
            sel = (rt["globalTid"] == s.globalTid) & (rt["start"] >= s.start) & (rt["start"] < s.end)
            rt.loc[sel, "step"] = s.n
        ops = pd.concat([k[["start", "end", "correlationId", "name"]], m.assign(name="memory")])
        ops = ops.merge(rt[["correlationId", "step"]], on="correlationId", how="left")
        first = steps["n"].min()
        sel = ops[ops["step"].notna() & (ops["step"] > first)]
        w0, w1 = sel["start"].min(), sel["end"].max()
        ops = ops[(ops["end"] > w0) & (ops["start"] < w1)].copy()
        ops["s"], ops["e"] = ops["start"].clip(lower=w0), ops["end"].clip(upper=w1)

        def merge(df: pd.DataFrame) -> list[list[int]]:
            res: list[list[int]] = []
            for s, e in df.sort_values("s")[["s", "e"]].itertuples(index=False):
                if res and s <= res[-1][1]:
                    res[-1][1] = max(res[-1][1], e)
                else:
                    res.append([s, e])
            return res

        is_comm = ops["name"].fillna("").str.startswith("nccl")
        comp, comm = merge(ops[~is_comm & (ops["name"] != "memory")]), merge(ops[is_comm])
        busy = merge(ops)
        overlap = 0
        for a in comm:
            for b in comp:
                overlap += max(0, min(a[1], b[1]) - max(a[0], b[0]))
        gaps = [(a[1], b[0]) for a, b in itertools.pairwise(busy) if b[0] - a[1] >= 1_000_000]
        ranges = nv[~nv.index.isin(steps.index) & (nv["domainId"].fillna(0) == 0)]
        attributed = {}
        for gs, ge in gaps:
            cover = ranges[(ranges["start"] < ge) & (ranges["end"] > gs)]
            ov = cover["end"].clip(upper=ge) - cover["start"].clip(lower=gs)
            cover = cover[2 * ov >= ge - gs]
            if len(cover):
                name = cover.assign(d=cover["end"] - cover["start"]).sort_values("d").iloc[0]["text"]
                attributed[name] = attributed.get(name, 0) + ge - gs
        out[f.name] = {"busy": sum(e - s for s, e in busy), "overlap": overlap, "window": int(w1 - w0),
                       "gaps": attributed}
    return {"ranks": len(out)}


def _child(fn, args, q) -> None:  # runs in a fresh process: its own peak RSS
    t = time.perf_counter()
    info = fn(*args)
    q.put({"s": time.perf_counter() - t, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           **info})


def run_phase(fn, *args) -> dict:
    q: mp.Queue = mp.get_context("fork").Queue()
    p = mp.get_context("fork").Process(target=_child, args=(fn, args, q))
    p.start()
    res = q.get()
    p.join()
    return res


def bench_export(n_reports: int) -> dict | None:
    nsys = shutil.which("nsys")
    if not nsys:
        return None
    from orchestrator.collect.gather import discover, export_all

    work = Path(tempfile.mkdtemp(prefix="orch-bench-export-"))
    prog = work / "p.py"
    prog.write_text("import nvtx, time\nfor i in range(200):\n    nvtx.push_range(f'step {i}')\n"
                    "    time.sleep(0.001)\n    nvtx.pop_range()\n")
    for r in range(n_reports):
        subprocess.run([nsys, "profile", "--trace=nvtx,osrt", "--sample=none", "--cpuctxsw=none", "-o",
                        str(work / f"rep_1_r{r}_h.{r}"), sys.executable, str(prog)], capture_output=True, check=True)
    out = {}
    for workers in (1, 2):
        dest = work / f"exports{workers}"
        reports = discover([work], "rep_")
        t = time.perf_counter()
        export_all(reports, dest, nsys=nsys, workers=workers)
        out[workers] = time.perf_counter() - t
        assert all(r.sqlite for r in reports)
    shutil.rmtree(work, ignore_errors=True)
    return {"reports": n_reports, "s_1_worker": out[1], "s_2_workers": out[2], "speedup": out[1] / out[2]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[8, 32, 128, 512])
    ap.add_argument("--repeat", type=int, default=1, help="repeat each rank's steps to grow it")
    ap.add_argument("--source", type=Path, default=default_source())
    ap.add_argument("--pandas-max", type=int, default=128, help="skip the (slow) pandas baseline above this")
    ap.add_argument("--export-reports", type=int, default=8)
    ap.add_argument("--out", type=Path, default=REPO / "docs")
    a = ap.parse_args()
    results = []
    for n in a.ranks:
        d = dataset(n, a.repeat, a.source)
        store = Path(tempfile.mkdtemp(prefix="orch-bench-store-"))
        row: dict = {"ranks": n, "bytes": sum(f.stat().st_size for f in d.glob("*.sqlite"))}
        row["floor"] = run_phase(phase_floor, d)
        row["ingest"] = run_phase(phase_ingest, d, store)
        row["analyze"] = run_phase(phase_analyze, store)
        row["pandas"] = run_phase(phase_pandas, d) if n <= a.pandas_max else None
        shutil.rmtree(store, ignore_errors=True)
        orch_s = row["ingest"]["s"] + row["analyze"]["s"]
        row["orch_s"] = orch_s
        row["orch_over_floor"] = orch_s / row["floor"]["s"]
        row["pandas_over_orch"] = row["pandas"]["s"] / orch_s if row["pandas"] else None
        row["rows_per_s"] = row["floor"]["rows"] / orch_s
        results.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "bytes"}), flush=True)
    export = bench_export(a.export_reports)
    write(results, export, a)


def write(results: list[dict], export: dict | None, a: argparse.Namespace) -> None:
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "benchmarks.json").write_text(json.dumps({"results": results, "export": export,
                                                       "repeat": a.repeat, "source": a.source.name,
                                                       "cpus": os.cpu_count()}, indent=2) + "\n")
    by_n = {r["ranks"]: r for r in results}
    lines = [
        "# Benchmarks", "",
        f"`python scripts/bench.py --ranks {' '.join(map(str, a.ranks))} --repeat {a.repeat}` on this "
        f"{os.cpu_count()}-core machine; synthetic ranks copied from the real export `{a.source.name}` "
        "(per-rank clock skew, time shift and jitter). Each phase runs in its own child process; RSS is "
        "that child's peak.", "",
        "| ranks | rows | floor s | ingest s | analyze s | orch s | orch/floor | pandas s | pandas/orch |"
        " rows/s (orch) | peak RSS ingest MB | peak RSS analyze MB |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        p = r["pandas"]
        lines.append(
            f"| {r['ranks']} | {r['floor']['rows']:,} | {r['floor']['s']:.2f} | {r['ingest']['s']:.2f} | "
            f"{r['analyze']['s']:.2f} | {r['orch_s']:.2f} | {r['orch_over_floor']:.2f} | "
            f"{p['s']:.2f} | {r['pandas_over_orch']:.1f} | " if p else
            f"| {r['ranks']} | {r['floor']['rows']:,} | {r['floor']['s']:.2f} | {r['ingest']['s']:.2f} | "
            f"{r['analyze']['s']:.2f} | {r['orch_s']:.2f} | {r['orch_over_floor']:.2f} | - | - | ")
        lines[-1] += f"{r['rows_per_s']:,.0f} | {r['ingest']['rss_mb']:.0f} | {r['analyze']['rss_mb']:.0f} |"
    lines += ["", "Goals:"]
    worst = max(r["orch_over_floor"] for r in results)
    lines.append(f"- ingest + analysis <= 1.5x the raw read floor: worst {worst:.2f}x "
                 f"({'met' if worst <= 1.5 else 'MISSED'})")
    if 128 in by_n and by_n[128]["pandas_over_orch"]:
        v = by_n[128]["pandas_over_orch"]
        lines.append(f"- >= 10x faster than pandas at 128 ranks: {v:.1f}x ({'met' if v >= 10 else 'MISSED'})")
    if 128 in by_n and 512 in by_n:
        v = by_n[512]["orch_s"] / by_n[128]["orch_s"]
        lines.append(f"- 512 ranks <= 4.5x the 128-rank time: {v:.2f}x ({'met' if v <= 4.5 else 'MISSED'})")
    if 512 in by_n:
        v = max(by_n[512]["ingest"]["rss_mb"], by_n[512]["analyze"]["rss_mb"])
        lines.append(f"- peak RSS <= 2 GiB at 512 ranks: {v:.0f} MB ({'met' if v <= 2048 else 'MISSED'})")
    if export:
        lines.append(f"- parallel export >= 1.8x on 2 workers: {export['speedup']:.2f}x over {export['reports']} "
                     f"real nsys reports ({export['s_1_worker']:.2f} s -> {export['s_2_workers']:.2f} s; "
                     f"{'met' if export['speedup'] >= 1.8 else 'MISSED'})")
    (a.out / "benchmarks.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
