"""What the user waits for after a job of many real GPU ranks: `orch collect` of parts the job
already mapped (the reduce) and `orch report --json`, on this machine's cores.

    python scripts/bench_real_ranks.py [--ranks 256] [--job resnet_nw2] [--work DIR] [--keep]

Rank k of N is a hard link to rank k % 2 of the real 2-rank capture tests/fixtures/real/<job>
(torchvision ResNet-50 DDP on 2 H200s, nsys 2025.3) under its own file name, 8 ranks a host, so
every rank is real GPU work: ~10.8k kernels and ~34k CUDA calls a rank. First every rank is
mapped as the job maps it (`orch collect --from ... --parts --map-stats`, not timed as
after-job); then, with every part fresh, the two commands the user runs, each its own process
under /usr/bin/time (wall, peak RSS), orch compiled to bytecode first as an installed orch is.
Prints one Markdown row for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import gzip
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_data import REPO, compile_tree

ORCH = [sys.executable, "-m", "orchestrator.cli"]


def make_ranks(job: str, n: int, dest: Path) -> Path:
    """dest/exports with N hard links to the job's two real exports (unpacked once)."""
    src = sorted((REPO / "tests" / "fixtures" / "real").glob(f"{job}_r[01]_*.sqlite.gz"))
    if len(src) != 2:
        raise SystemExit(f"tests/fixtures/real holds no 2-rank job {job!r}")
    base = dest / "source"
    base.mkdir(parents=True, exist_ok=True)
    plain = []
    for gz in src:
        out = base / gz.name.removesuffix(".gz")
        if not out.exists():
            with gzip.open(gz, "rb") as fi, open(out, "wb") as fo:
                shutil.copyfileobj(fi, fo)
        plain.append(out)
    exports = dest / "exports"
    shutil.rmtree(exports, ignore_errors=True)
    exports.mkdir()
    for k in range(n):
        pid = re.search(r"\.(\d+)\.sqlite$", plain[k % 2].name).group(1)
        os.link(plain[k % 2], exports / f"{job}_r{k}_n{k // 8}.{int(pid) + k}.sqlite")
    return exports


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall s, peak RSS MB) of one command in its own process, run in this checkout: `python -m`
    imports the package of its working directory first, so another directory would time another orch."""
    t = time.perf_counter()
    p = subprocess.run(["/usr/bin/time", "-f", "%M", *cmd], capture_output=True, text=True, check=False, cwd=REPO)
    wall = time.perf_counter() - t
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stderr[-2000:]}")
    return wall, int(p.stderr.strip().splitlines()[-1]) / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--job", default="resnet_nw2")
    ap.add_argument("--work", type=Path, help="where the ranks and the store go (default: a temp dir)")
    ap.add_argument("--runs", type=int, default=1, help="after-job runs (the parts stay fresh)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    a = ap.parse_args()
    compile_tree(REPO)
    work = a.work or Path(tempfile.mkdtemp(prefix="orch-real-ranks-"))
    try:
        exports = make_ranks(a.job, a.ranks, work)
        store = work / "store"
        collect = [*ORCH, "collect", "--from", str(exports), "--out", str(store), "--parts", "--workers", "2"]
        map_s, map_mb = timed([*collect, "--map-stats"])
        print(f"maps ({a.ranks} ranks, as the job makes them): {map_s:.1f} s, {map_mb:.0f} MB", file=sys.stderr)
        for _ in range(a.runs):
            c_s, c_mb = timed(collect)
            r_s, r_mb = timed([*ORCH, "report", str(store), "--json", str(work / "report.json")])
            print(f"| {a.ranks} real GPU ranks ({a.job}) | {c_s:.1f} s, {c_mb:.0f} MB | {r_s:.1f} s, {r_mb:.0f} MB "
                  f"| {c_s + r_s:.1f} s |")
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
