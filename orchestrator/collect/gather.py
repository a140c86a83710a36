"""Find every rank's report and make a SQLite export of each (the gather step).

Reports come as `.nsys-rep` (exported here with `nsys export --type sqlite`, in parallel),
`.sqlite` (used as is) or `.sqlite.gz` (decompressed). Derived files go to `<run>/exports/`;
raw reports are never modified or deleted. Every new file is written under a temp name and
renamed, so an interrupted collect never leaves a half-written export that looks complete.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import IO

from orchestrator import naming
from orchestrator.collect.decompress import TooLarge, clean_stale, gunzip_capped
from orchestrator.errors import OrchError
from orchestrator.nsys import UNKNOWN_OPTION_ERE, newer_export_options
from orchestrator.runpaths import RunPaths

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


def exports_dir(run: Path) -> Path:
    """Where a run's exports and decompressed copies go (kept: a later collect reuses them)."""
    return RunPaths(run).exports


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


# Options of newer nsys (2024+) that orch asks for optimistically: an nsys that rejects one is
# remembered (nsys path -> rejected option names) and asked without it from then on.
_REJECTED: dict[str, set[str]] = {}
_UNKNOWN_OPTION = re.compile(UNKNOWN_OPTION_ERE + r"\W*(?P<option>--[a-z-]+)", re.IGNORECASE)


@dataclass
class Started:
    """An `nsys export` running in the background: started by `_start`, waited for by
    `_finish`. Its output goes to a file, not a pipe: nobody reads a pipe while an export
    started early runs, and a full one would stall nsys."""

    proc: subprocess.Popen[bytes]
    tmp: Path  # what nsys writes; renamed to the export when it succeeds
    log: IO[bytes]  # stdout and stderr
    nsys: str
    options: tuple[str, ...]  # the newer options asked for (newer_export_options)


# The exports this process runs: a collect or a map worker stopped by SIGTERM kills them before
# it ends (stopped_by_term, mapreduce._map_worker), since nothing else would.
_RUNNING: set[subprocess.Popen[bytes]] = set()


def kill_running() -> None:
    """Kill every export this process started that is still running."""
    for proc in list(_RUNNING):
        with contextlib.suppress(OSError):
            proc.kill()


@contextmanager
def stopped_by_term() -> Iterator[None]:
    """While the collect exports or maps: a SIGTERM sent to it alone (`timeout`, a scheduler;
    Ctrl-C reaches the whole process group, this does not) kills its exports and stops its map
    workers (mapreduce._map_worker), then stops the collect as Ctrl-C does (KeyboardInterrupt:
    nothing half-written is kept). Without it the collect would die at once and leave them
    running. Only the main thread can take a signal; elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def term(_signum: int, _frame: FrameType | None) -> None:
        for child in mp.active_children():
            child.terminate()
        kill_running()
        raise KeyboardInterrupt

    before = signal.signal(signal.SIGTERM, term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def _start(nsys: str, origin: Path, tmp: Path) -> Started:
    """`nsys export` to SQLite with the newer options this nsys has not rejected. Asked
    optimistically (`_nsys_export` asks again without an option nsys rejects): a `nsys export
    --help` probe first would add one more nsys start to every collect (docs/benchmarks-code.md)."""
    rejected = _REJECTED.get(nsys, set())
    newer = {name: args for name, args in newer_export_options().items() if name not in rejected}
    log = tempfile.TemporaryFile()  # noqa: SIM115 (outlives this call: _finish or _stop closes it)
    cmd = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true",
           *(arg for args in newer.values() for arg in args), "--output", str(tmp), str(origin)]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    except BaseException:
        log.close()
        raise
    _RUNNING.add(proc)
    return Started(proc=proc, tmp=tmp, log=log, nsys=nsys, options=tuple(newer))


def _stop(s: Started) -> None:
    """Kill an export that is no longer wanted and remove what it wrote."""
    if s.proc.poll() is None:
        s.proc.kill()
    s.proc.wait()
    _RUNNING.discard(s.proc)
    s.log.close()
    s.tmp.unlink(missing_ok=True)


def _finish(s: Started, timeout_s: float) -> tuple[int, str]:
    """Wait for the export: its exit status and output (killed past the timeout, and on Ctrl-C)."""
    try:
        code = s.proc.wait(timeout=timeout_s)
    except BaseException:
        _stop(s)
        raise
    _RUNNING.discard(s.proc)
    s.log.seek(0)
    said = s.log.read().decode(errors="replace")
    s.log.close()
    return code, said


def _nsys_export(nsys: str, origin: Path, tmp: Path, timeout_s: float,
                 started: Started | None = None) -> tuple[int, str]:
    """Export `origin` to `tmp` (or wait for `started`, which does); a newer option this nsys
    rejects is remembered and the export asked again without it."""
    s = started or _start(nsys, origin, tmp)
    code, said = _finish(s, timeout_s)
    while code != 0 and (m := _UNKNOWN_OPTION.search(said)) and (name := m["option"]) in s.options:
        _REJECTED.setdefault(nsys, set()).add(name)
        s = _start(nsys, origin, tmp)
        code, said = _finish(s, timeout_s)
    return code, said


def export_workers(workers: int | None) -> int:
    """How many exports run at a time: nsys export is single-threaded and memory-hungry."""
    return workers or min(8, os.cpu_count() or 2)


def _tmp_name(out_dir: Path, stem: str) -> Path:
    return out_dir / f".{stem}.tmp-{os.getpid()}-{uuid.uuid4().hex}.sqlite"


def _needs_export(r: ReportFile, out_dir: Path) -> bool:
    return (r.sqlite is None and not r.origin.name.endswith(".sqlite.gz")
            and not _fresh(out_dir / f"{r.stem}.sqlite", r.origin))


@contextmanager
def early_exports(paths: list[Path], run: Path, *, nsys: str | None, workers: int | None,
                  name_prefix: str | None = None) -> Iterator[dict[Path, Started]]:
    """Start the first exports the collect will need now, before the command loads the rest of
    orch (pydantic, DuckDB, rich: slow imports), so that nsys runs meanwhile; `export_all`
    takes them over (pass what this yields as `started=`). Best effort: a problem here
    (no nsys, a bad path) leaves the work, and the error message, to the collect. On the way
    out, exports nobody took over are killed, their temp files removed, and the folders made
    here removed if empty, so a command that fails after this keeps nothing."""
    out_dir = exports_dir(run)
    made: list[Path] = []
    started: dict[Path, Started] = {}
    # The stop is in place before the first export starts: a SIGTERM while the command still
    # loads its modules kills these exports too.
    with stopped_by_term():
        try:
            try:
                found = find_nsys(nsys)
                if found is not None:
                    todo = [r for r in discover(paths, name_prefix) if _needs_export(r, out_dir)]
                    if todo:
                        made = [d for d in (out_dir, *out_dir.parents) if not d.exists()]
                        out_dir.mkdir(parents=True, exist_ok=True)
                    for r in todo[:export_workers(workers)]:
                        started[r.origin] = _start(found, r.origin, _tmp_name(out_dir, r.stem))
            except (OrchError, OSError):
                pass
            yield started
        finally:
            for s in started.values():
                _stop(s)
            for d in made:
                try:
                    d.rmdir()
                except OSError:
                    break


def _fresh(target: Path, source: Path) -> bool:
    return target.exists() and target.stat().st_size > 0 and target.stat().st_mtime >= source.stat().st_mtime


def export_one(r: ReportFile, out_dir: Path, nsys: str | None, timeout_s: float,
               started: dict[Path, Started] | None = None) -> None:
    """Export (or decompress) one report into `out_dir`, unless a fresh export is there;
    an export in `started` (early_exports) is waited for instead of started again."""
    target = out_dir / f"{r.stem}.sqlite"
    if r.sqlite is not None:
        return
    if _fresh(target, r.origin):
        r.sqlite = target
        return
    early = started.pop(r.origin, None) if started else None
    if early is not None and early.nsys != nsys:
        _stop(early)
        early = None
    tmp = early.tmp if early is not None else _tmp_name(out_dir, r.stem)
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
                code, said = _nsys_export(nsys, r.origin, tmp, timeout_s, early)
            except subprocess.TimeoutExpired:
                r.error = f"nsys export timed out after {timeout_s:.0f}s"
                return
            if code != 0 or not tmp.exists():
                last = said.strip().splitlines()[-1:] or ["no output"]
                r.error = f"nsys export failed (exit {code}): {last[0][:200]}"
                return
        tmp.replace(target)
        r.sqlite = target
    finally:
        tmp.unlink(missing_ok=True)


def export_all(reports: list[ReportFile], out_dir: Path, *, nsys: str | None, workers: int,
               on_done: Callable[[ReportFile], None] | None = None, timeout_s: float = 3600,
               started: dict[Path, Started] | None = None) -> None:
    """Export/decompress in a bounded pool; nsys runs in subprocesses, so threads suffice.
    `started`: exports already running (`early_exports`), taken over instead of started again."""
    out_dir.mkdir(parents=True, exist_ok=True)
    clean_stale(out_dir, _EXPORT_TMP)

    def work(r: ReportFile) -> ReportFile:
        export_one(r, out_dir, nsys, timeout_s, started)
        return r

    with stopped_by_term(), ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for r in pool.map(work, reports):
            if on_done:
                on_done(r)
