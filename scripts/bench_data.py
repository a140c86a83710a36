"""Datasets and timed phases of scripts/bench.py (each phase runs in its own child process).

Datasets: REAL exports (every H200 capture in tests/fixtures/h200 and tests/fixtures/gpu_e2e,
renamed as the ranks of one job, plus the largest real job alone), and synthetic ranks made
from one real export (per-rank clock skew, time shift and jitter) for scale.
Floors: `floor_py` (plain sqlite3 read of every row orch reads), `floor_c` (DuckDB's sqlite
scanner materializing every column of every source table orch reads, of every export, into
memory: the C-level floor any DuckDB-based ingest must at least pay).
"""

from __future__ import annotations

import gzip
import os
import random
import shutil
import sqlite3
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("ORCH_BENCH_CACHE", Path.home() / ".cache" / "orch-bench"))
# floor py5: five event tables, every row: the narrower Python floor of docs/benchmarks.md.
FLOOR5 = ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
          "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS"]
# Every source table orch reads today (store v2).
SOURCES = [*FLOOR5, "OSRT_API", "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", "GPU_METRICS", "ThreadNames", "StringIds"]
REAL_DIRS = [REPO / "tests" / "fixtures" / "h200", REPO / "tests" / "fixtures" / "gpu_e2e",
             REPO / "tests" / "fixtures" / "real"]  # the last: ResNet-50, GPT-2, pipelining captures


def compile_tree(tree: Path) -> None:
    """Compile an orch tree to bytecode first, as `pip install` does: an editable install run
    with PYTHONDONTWRITEBYTECODE set (this machine's default) recompiles every module on every
    start (a cost the timings would charge to orch; docs/benchmarks-code.md), which no
    installed orch pays."""
    import compileall

    if not compileall.compile_dir(str(tree / "orchestrator"), quiet=1):
        raise SystemExit(f"cannot compile {tree / 'orchestrator'} to bytecode")


def default_source() -> Path:
    return REAL_DIRS[0] / "ddp_straggler" / "ddp_straggler_r1_vm.2402.sqlite.gz"


def _unpack(src: Path, dest: Path) -> None:
    if src.suffix == ".gz":
        with gzip.open(src, "rb") as fi, open(dest, "wb") as fo:
            shutil.copyfileobj(fi, fo)
    else:
        shutil.copy(src, dest)


# Real jobs of their own folder: the 4-GPU ResNet-50 DDP run (tutorial trainer, 4 H200s).
REAL_JOB_DIRS = {"resnet_ddp4": REPO / "tests" / "fixtures" / "pairs" / "ddp4-healthy" / "exports"}


def real_dataset(job: str | None = None) -> Path | None:
    """All real exports as the ranks of one job (job=None), or one real job's own ranks (a job
    of REAL_JOB_DIRS: every export of its folder)."""
    if job in REAL_JOB_DIRS:
        files = sorted(REAL_JOB_DIRS[job].glob("*.sqlite.gz"))
    else:
        files = sorted(f for d in REAL_DIRS if d.is_dir() for f in d.rglob("*.sqlite.gz"))
        if job:
            files = [f for f in files if f.name.startswith(f"{job}_r")]
    if not files:
        return None
    d = CACHE / f"real-{job or 'all'}-{len(files)}"
    if (d / ".complete").exists():
        return d
    d.mkdir(parents=True, exist_ok=True)
    for r, f in enumerate(files):
        host = f.name.split("_r")[0].replace("_", "-")
        name = f.name[: -len(".gz")] if job else f"real_1_r{r}_{host}.{1000 + r}.sqlite"
        _unpack(f, d / name)
    (d / ".complete").touch()
    return d


def make_template(source: Path, repeat: int, dest: Path) -> None:
    """One rank's export, optionally with its steps repeated `repeat` times (shifted copies)."""
    _unpack(source, dest)
    con = sqlite3.connect(dest)
    con.execute("DROP TABLE IF EXISTS GPU_METRICS")  # rank 1 of the source has none either
    if repeat > 1:
        # The copied window: the GPU's span, from a little before its first kernel (the launches
        # come first). Only events wholly inside it are copied, each copy after the last, so no
        # range overlaps its own copy (a range crossing the window's edge would, at its own
        # nesting depth: a trace no program makes).
        lo, hi = con.execute("SELECT min(start), max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
        w0 = lo - 50_000_000
        span = hi - w0 + 1_000_000
        for t, timed in timed_columns(con).items():
            cols = [r[1] for r in con.execute(f"PRAGMA table_info({t})")]
            sel = ", ".join(
                f"{c} + {{k}} * {span}" if c in timed else
                (f"{c} + {{k}} * 100000000" if c == "correlationId" else c) for c in cols)
            first, last = timed[0], timed[-1]
            for k in range(1, repeat):
                con.execute(f"INSERT INTO {t} SELECT {sel.format(k=k)} FROM {t} "
                            f"WHERE {first} >= {w0} AND {last} <= {hi} AND {first} <= {hi}")
    con.commit()
    con.execute("VACUUM")
    con.close()


def timed_columns(con: sqlite3.Connection) -> dict[str, list[str]]:
    """Every source table orch reads times from (the registry's tables with shifted columns,
    PROFILER_OVERHEAD and GPU memory included), with the time columns this export has: a
    synthetic rank moves all of them, or its profiler flushes land elsewhere than its events."""
    from orchestrator.store.tables import TABLES

    have = _tables(con)
    out = {}
    for t in TABLES.values():
        if t.shifted and t.source in have:
            cols = {r[1] for r in con.execute(f"PRAGMA table_info({t.source})")}
            if timed := [c for c in ("start", "end", "timestamp") if c in cols]:
                out[t.source] = timed
    return out


def make_rank(template: Path, rank: int, world: int, dest: Path, rng: random.Random) -> None:
    """A copy with its own rank, session start (clock skew) and a few ms of jitter."""
    shutil.copy(template, dest)
    con = sqlite3.connect(dest)
    skew = rng.randint(-2_000_000_000, 2_000_000_000)
    con.execute("UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = utcEpochNs + ?", [skew])
    shift = -skew + rng.randint(0, 3_000_000)
    for t, cols in timed_columns(con).items():
        con.execute(f"UPDATE {t} SET " + ", ".join(f"{c} = {c} + ?" for c in cols), [shift] * len(cols))
    con.execute("UPDATE META_DATA_CAPTURE SET value = ? WHERE value LIKE 'RANK=%'", [f'RANK="{rank}"'])
    con.execute("UPDATE META_DATA_CAPTURE SET value = ? WHERE value LIKE 'WORLD_SIZE=%'", [f'WORLD_SIZE="{world}"'])
    con.commit()
    con.close()


def synthetic_dataset(n: int, repeat: int, source: Path) -> Path:
    # The suffix names what the generator makes (bumped when that changes: a cache is never reused
    # across generators).
    d = CACHE / f"{source.name.split('.')[0]}-x{repeat}{'-v2' if repeat > 1 else ''}-s2" / f"n{n}"
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


def _tables(con: sqlite3.Connection) -> set[str]:
    return {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def phase_floor_py(d: Path, tables: list[str]) -> dict:
    """Plain sequential sqlite3 read of every row of `tables` (OSRT_API: the rows orch keeps,
    filtered by SQLite as any reader would)."""
    from orchestrator.store.tables import OSRT_MIN_NS

    rows = 0
    for f in sorted(d.glob("*.sqlite")):
        con = sqlite3.connect(f)
        have = _tables(con)
        for t in tables:
            if t not in have:
                continue
            where = f" WHERE end - start >= {OSRT_MIN_NS} OR end < start" if t == "OSRT_API" else ""
            cur = con.execute(f"SELECT * FROM {t}{where}")
            while chunk := cur.fetchmany(65536):
                rows += len(chunk)
        con.close()
    return {"rows": rows}


def phase_floor_c(d: Path, tables: list[str]) -> dict:
    """DuckDB (default threads) + the sqlite scanner: CREATE TABLE AS SELECT * of every source
    table of every export, in memory. Includes `import duckdb` and the extension load."""
    import duckdb

    from orchestrator.collect.ingest import scanner_extension_path

    con = duckdb.connect()
    con.execute(f"LOAD '{scanner_extension_path()}'")
    rows = 0
    for i, f in enumerate(sorted(d.glob("*.sqlite"))):
        con.execute(f"ATTACH '{f}' AS s{i} (TYPE sqlite, READ_ONLY)")
        have = {r[0] for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_catalog = ?", [f"s{i}"]).fetchall()}
        for t in tables:
            if t in have:
                con.execute(f"CREATE TABLE m{i}_{t} AS SELECT * FROM s{i}.{t}")
                rows += con.execute(f"SELECT count(*) FROM m{i}_{t}").fetchone()[0]
        con.execute(f"DETACH s{i}")
    return {"rows": rows}


def phase_ingest(d: Path, store_dir: Path) -> dict:
    from rich.console import Console

    from orchestrator.collect.collect import collect
    from orchestrator.collect.identity import Layout

    res = collect([d], store_dir, layout=Layout(), workers=None, console=Console(stderr=True, quiet=True))
    assert len(res.ok_ranks) == len(list(d.glob("*.sqlite"))), res.bad[:3]
    return {"engine": res.engine}


def phase_analyze(store_dir: Path) -> dict:
    from orchestrator.metrics.engine import Options

    rep = _build_report()(store_dir / "profile.duckdb", Options())
    return {"ranks": len(rep.ranks)}


def _build_report():
    """The report's builder of the orch tree on sys.path (a --baseline may predate its name)."""
    try:
        from orchestrator.analyze.build import build_report
    except ModuleNotFoundError:
        from orchestrator.analyze.report import build_report
    return build_report


def phase_orch_in(tree: str, d: Path, store_dir: Path) -> dict:
    """`phase_orch` with another orch tree first on sys.path (the before of an A/B)."""
    import sys

    sys.path.insert(0, tree)
    for name in [m for m in sys.modules if m == "orchestrator" or m.startswith("orchestrator.")]:
        del sys.modules[name]
    return phase_orch(d, store_dir)


def phase_orch(d: Path, store_dir: Path) -> dict:
    """`orch analyze` in one process, as the CLI runs it (imports paid once): collect, then the
    report on the collect's own connection while the store's checkpoint runs
    (`collect.collecting`); an orch tree without it (a --baseline): collect, then report."""
    import orchestrator.collect.collect as cc

    if not hasattr(cc, "collecting"):
        phase_ingest(d, store_dir)
        return phase_analyze(store_dir)
    from rich.console import Console

    from orchestrator.collect.identity import Layout
    from orchestrator.metrics.engine import Options

    build_report = _build_report()

    with cc.collecting([d], store_dir, layout=Layout(), workers=None, console=Console(stderr=True, quiet=True),
                       background=True) as (res, con):
        assert len(res.ok_ranks) == len(list(d.glob("*.sqlite"))), res.bad[:3]
        rep = build_report(store_dir / "profile.duckdb", Options(), con)
    return {"ranks": len(rep.ranks)}


def phase_pandas(d: Path) -> dict:
    """Per rank DataFrames and Python interval merges, as HTA / the nsys recipes do it."""
    import itertools
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
