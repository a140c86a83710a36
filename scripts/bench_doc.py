"""docs/benchmarks.md from scripts/bench.py's results: the tables, each speed goal as a
ratio measured side by side in one run (met/MISSED), and the GPU-machine plan (not run here)."""

from __future__ import annotations


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def render(results: list[dict], meta: dict) -> str:
    lines = [
        "# Benchmarks", "",
        f"`python scripts/bench.py --ranks {' '.join(map(str, meta['ranks']))} --runs {meta['runs']}` on "
        f"{meta['date']}, {meta['machine']}. Synthetic ranks are copies of the real export `{meta['source']}` "
        "(per-rank clock skew, time shift, jitter); `real:` rows are the H200 exports themselves "
        "(tests/fixtures/h200, tests/fixtures/gpu_e2e and the ResNet-50/GPT-2/pipelining "
        "captures of tests/fixtures/real; `all N` renames them as ranks 0..N-1 of one job; `resnet_nw2` is "
        "the seed tutorial's ResNet-50 DDP with 2 DataLoader workers, `resnet_ddp4` its 4-GPU run of "
        "tests/fixtures/pairs/ddp4-healthy). "
        "Each phase runs in its own child process (imports included, from bytecode compiled "
        "beforehand as `pip install` does; RSS is that "
        "child's peak); phases run alternately, medians of the runs are shown (512 ranks: 2 runs).", "",
        "- **floor C**: DuckDB's sqlite scanner materializing every column of every source table orch "
        "reads (kernels, memcpy, memset, runtime, NVTX, OSRT, sync, GPU metrics, thread names, StringIds), "
        "all rows, of every export, into memory (import duckdb and the extension load included).",
        "- **floor py**: plain sqlite3 read of every row of the same tables (OSRT: the rows orch keeps, "
        "filtered by SQLite); **floor py5**: the original floor (five event tables).",
        "- **orch**: `orch analyze` in one process: collect (probe, ingest, store) + report (every view "
        "and rule), the report on the collect's own connection while the store's checkpoint runs, as the "
        "CLI does it; ingest (`orch collect`) and analyze (`orch report` of the kept store) are also timed "
        "alone. **before**: the same with the orch of "
        f"`--baseline` ({meta.get('baseline_label') or 'an earlier tree'}), alternated with the others in the "
        "same run.", "",
        "| dataset | ranks | MB | floor C s | floor py s | floor py5 s | orch s | ingest s | analyze s | "
        "orch/floor C | orch/floor py | orch/py5 | pandas s | pandas/orch | RSS orch MB | before s | "
        "before/floor C | before/floor py |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        q, p = r["ratios"], r.get("pandas")
        lines.append(
            f"| {r['dataset']} | {r['ranks']} | {r['bytes'] / 2**20:.0f} | {r['floor_c']['s']:.2f} | "
            f"{r['floor_py']['s']:.2f} | {r['floor_py5']['s']:.2f} | {r['orch']['s']:.2f} | "
            f"{r['ingest']['s']:.2f} | {r['analyze']['s']:.2f} | {q['orch/floor_c']:.2f} | "
            f"{q['orch/floor_py']:.2f} | {q['orch/floor_py5']:.2f} | {_f(p['s'] if p else None)} | "
            f"{_f(q['pandas/orch'], '{:.1f}')} | {r['orch']['rss_mb']:.0f} | "
            f"{_f(r['orch_before']['s'] if 'orch_before' in r else None)} | {_f(q.get('before/floor_c'))} | "
            f"{_f(q.get('before/floor_py'))} |")
    lines += ["", "CPU seconds (user + system, all threads; less sensitive to other load on a shared machine "
              "than wall time):", "",
              "| dataset | floor C cpu s | floor py cpu s | orch cpu s | before cpu s | orch/floor C (cpu) | "
              "orch/floor py (cpu) | before/floor C (cpu) |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        q, b = r["ratios"], r.get("orch_before")
        lines.append(f"| {r['dataset']} | {r['floor_c']['cpu_s']:.2f} | {r['floor_py']['cpu_s']:.2f} | "
                     f"{r['orch']['cpu_s']:.2f} | {_f(b['cpu_s'] if b else None)} | "
                     f"{q['cpu orch/floor_c']:.2f} | {q['cpu orch/floor_py']:.2f} | "
                     f"{_f(q.get('cpu before/floor_c'))} |")
    lines += ["", "## Goals", ""]
    real = [r for r in results if r["dataset"].startswith("real")]
    if real:
        worst = max(r["ratios"]["orch/floor_c"] for r in real)
        lines.append(f"- `orch analyze` on real multi-rank exports <= 1.5x the C floor: worst {worst:.2f}x "
                     f"({_verdict(worst <= 1.5)}; moonshot <= 1.0x: {_verdict(worst <= 1.0)})")
    syn = {r["ranks"]: r for r in results if r["dataset"].startswith("synthetic")}
    if 8 in syn:
        v = syn[8]["ratios"]["orch/floor_py"]
        lines.append(f"- 8 ranks <= 1.5x the Python floor: {v:.2f}x ({_verdict(v <= 1.5)}; "
                     f"against the 5-table floor {syn[8]['ratios']['orch/floor_py5']:.2f}x)")
    big = [syn[n] for n in sorted(syn) if n >= 32]
    if big:
        worst = max(r["ratios"]["orch/floor_py"] for r in big)
        lines.append(f"- 32-512 ranks <= 1.2x the Python floor: worst {worst:.2f}x ({_verdict(worst <= 1.2)}; "
                     + ", ".join(f"{r['ranks']}: {r['ratios']['orch/floor_py']:.2f}x" for r in big) + ")")
    if 128 in syn and syn[128]["ratios"]["pandas/orch"]:
        v = syn[128]["ratios"]["pandas/orch"]
        lines.append(f"- pandas >= 10x slower at 128 ranks: {v:.1f}x ({_verdict(v >= 10)})")
    if 512 in syn:
        v = max(syn[512][k]["rss_mb"] for k in ("orch", "ingest", "analyze"))
        lines.append(f"- peak RSS <= 2 GiB at 512 ranks: {v:.0f} MB ({_verdict(v <= 2048)})")
    lines += ["", "Where the time went, round by round: docs/history/ (docs/history/README.md).", "", GPU_PLAN]
    return "\n".join(lines) + "\n"


GPU_PLAN = """## On a GPU node: orch against `nsys recipe`, export formats

The whole pipeline on real `.nsys-rep` files, export included, against NVIDIA's
`nsys recipe nccl_gpu_overlap_trace` and `gpu_gaps` on the same reports, and the export formats,
timed side by side by `scripts/bench_recipe.sh` on the GPU machine: docs/benchmarks-gpu.md.

The same benchmark on the GPU machine's 16 CPU cores, with a `before` column, is
docs/benchmarks-16core.md.

## After the job: many real GPU ranks

What a user waits for after a job of 256 real GPU ranks whose maps ran in the job (`orch collect`
of fresh parts, then `orch report --json`), against the per-rank analysis moved into the map:
`scripts/bench_real_ranks.py`, beside `orch analyze` of 4 real ResNet-50 ranks (`scripts/bench.py
--ranks --real resnet_ddp4 resnet_nw2`). The latest numbers (2-core AMD EPYC, 24 GiB, main at e6b7392,
2026-11-29; each run's details in docs/history/benchmarks-after-job.md):

| what | measured | goal |
|---|---|---|
| 256 real GPU ranks: `orch collect`, `orch report --json` | 6.9 s (6.25-7.61), CPU 9.1 s, 450 MiB | <= 5 s: missed |
| `orch analyze` of 4 ResNet-50 ranks / C read floor | 2.67-2.79x (CPU 3.88-3.93x) | <= 1.5x: missed |
| `orch analyze` of 2 (resnet_nw2) | 2.59x (CPU 3.3x) | |

Both need the analysis at a third to a half of its CPU: fewer and smaller statements (168 a
report), not faster ones.
"""
