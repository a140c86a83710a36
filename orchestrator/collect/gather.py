"""Find every rank's report and make a SQLite export of each (the gather step).

Reports come as `.nsys-rep` (exported here with `nsys export --type sqlite`, in parallel),
`.sqlite` (used as is) or `.sqlite.gz` (decompressed). Derived files go to `<run>/exports/`;
raw reports are never modified or deleted. Every new file is written under a temp name and
renamed, so an interrupted collect never leaves a half-written export that looks complete.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from orchestrator import naming
from orchestrator.collect.decompress import TooLarge, clean_stale, gunzip_capped
from orchestrator.errors import OrchError

SUFFIXES = (".nsys-rep", ".qdrep", ".sqlite.gz", ".sqlite")
# Export temps carry the writer's pid, so a later run can remove those of a killed one.
_EXPORT_TMP = re.compile(r"\..*\.tmp-(?P<pid>[0-9]+)-[0-9a-f]{32}\.sqlite")


@dataclass
class ReportFile:
    origin: Path  # the file as found (never modified)
    stem: str  # name without report/export suffix
    rank: int | None = None  # from the name (orch's pattern)
    host: str | None = None
    pid: int | None = None
    sqlite: Path | None = None  # export to read
    error: str | None = None
    notes: tuple[str, ...] = ()  # what was wrong with the name (out-of-range numbers)


def split_suffix(path: Path) -> tuple[str, str] | None:
    for suf in SUFFIXES:
        if path.name.endswith(suf) and len(path.name) > len(suf):
            return path.name[: -len(suf)], suf
    return None


def discover(paths: Iterable[Path], name_prefix: str | None = None) -> list[ReportFile]:
    """Reports under the given files/directories, one entry per report stem: an export
    next to its `.nsys-rep` is reused only when it is newer than the report."""
    found: dict[tuple[Path, str], dict[str, Path]] = {}
    for root in paths:
        if not root.exists():
            raise OrchError(f"{root} does not exist; give report files or directories that hold them")
        candidates = sorted(root.rglob("*")) if root.is_dir() else [root]
        for f in candidates:
            split = split_suffix(f)
            if split is None or not f.is_file() or f.name.startswith("."):
                continue
            stem, suf = split
            if name_prefix and not stem.startswith(name_prefix):
                continue
            found.setdefault((f.parent, stem), {})[suf] = f
    reports = []
    for (_, stem), by_suf in sorted(found.items()):
        rep = by_suf.get(".nsys-rep") or by_suf.get(".qdrep")
        sq = by_suf.get(".sqlite")
        gz = by_suf.get(".sqlite.gz")
        origin = rep or sq or gz
        assert origin is not None
        name = naming.parse(stem)  # orch's or the seed sbatch's name pattern
        r = ReportFile(origin=origin, stem=stem, rank=name.rank, host=name.host, pid=name.pid, notes=name.problems)
        if sq is not None and (rep is None or sq.stat().st_mtime >= rep.stat().st_mtime):
            r.sqlite = sq
        reports.append(r)
    return reports


def find_nsys(preferred: str | None = None) -> str | None:
    for cand in (preferred, os.environ.get("NSYS"), "nsys"):
        if cand and shutil.which(cand):
            return shutil.which(cand)
    return None


# nsys binaries that rejected --include-json (before 2024): asked without it from then on.
_NO_JSON: set[str] = set()
_UNKNOWN_OPTION = re.compile(r"unrecogni[sz]ed option|unknown option|invalid option", re.IGNORECASE)


def _nsys_export(nsys: str, origin: Path, tmp: Path, timeout_s: float) -> subprocess.CompletedProcess:
    """`nsys export` to SQLite with `--include-json=true` where this nsys has it (2024+): without
    it NVTX extended payloads, such as NCCL's message sizes, are left out (issue 15). Asked
    optimistically: an nsys that rejects the option is remembered and asked again without it.
    (A `nsys export --help` probe ran first on every collect: 0.3 s with nsys 2022.4 here.)"""
    def run(extra: tuple[str, ...]) -> subprocess.CompletedProcess:
        cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true", *extra,
               "--output", str(tmp), str(origin)]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)

    if nsys in _NO_JSON:
        return run(())
    proc = run(("--include-json=true",))
    said = proc.stdout + proc.stderr
    if proc.returncode != 0 and "include-json" in said and _UNKNOWN_OPTION.search(said):
        _NO_JSON.add(nsys)
        return run(())
    return proc


def _fresh(target: Path, source: Path) -> bool:
    return target.exists() and target.stat().st_size > 0 and target.stat().st_mtime >= source.stat().st_mtime


def _export_one(r: ReportFile, out_dir: Path, nsys: str | None, timeout_s: float) -> None:
    target = out_dir / f"{r.stem}.sqlite"
    if r.sqlite is not None:
        return
    if _fresh(target, r.origin):
        r.sqlite = target
        return
    tmp = out_dir / f".{r.stem}.tmp-{os.getpid()}-{uuid.uuid4().hex}.sqlite"
    try:
        if r.origin.name.endswith(".sqlite.gz"):
            try:
                gunzip_capped(r.origin, tmp)
            except TooLarge as e:
                r.error = f"cannot decompress: {e}"
                return
            except (OSError, EOFError) as e:
                r.error = f"cannot decompress ({e}): the .gz file is truncated or corrupt"
                return
        else:
            if nsys is None:
                r.error = "needs `nsys export` but no nsys was found; put nsys on PATH or pass --nsys"
                return
            try:
                proc = _nsys_export(nsys, r.origin, tmp, timeout_s)
            except subprocess.TimeoutExpired:
                r.error = f"nsys export timed out after {timeout_s:.0f}s"
                return
            if proc.returncode != 0 or not tmp.exists():
                last = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
                r.error = f"nsys export failed (exit {proc.returncode}): {last[0][:200]}"
                return
        tmp.replace(target)
        r.sqlite = target
    finally:
        tmp.unlink(missing_ok=True)


def export_all(reports: list[ReportFile], out_dir: Path, *, nsys: str | None, workers: int,
               on_done: Callable[[ReportFile], None] | None = None, timeout_s: float = 3600) -> None:
    """Export/decompress in a bounded pool; nsys runs in subprocesses, so threads suffice."""
    out_dir.mkdir(parents=True, exist_ok=True)
    clean_stale(out_dir, _EXPORT_TMP)

    def work(r: ReportFile) -> ReportFile:
        _export_one(r, out_dir, nsys, timeout_s)
        return r

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for r in pool.map(work, reports):
            if on_done:
                on_done(r)
