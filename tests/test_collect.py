"""`orch collect` on real exports: row counts, one clock, identity, both engines, bad files,
secrets, idempotence and locking. Expected values come from sqlite3 directly."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from orchestrator.collect.collect import collect, run_lock
from orchestrator.collect.identity import Layout
from tests.conftest import capture_cpu, copies_with_env, h200_fixtures, run_orch

pytestmark = [pytest.mark.jobs, pytest.mark.nsys]

TABLES = {
    "kernels": "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL",
    "memcpy": "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY",
    "memset": "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET",
    "cuda_api": "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME",
    "nvtx": "SELECT count(*) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND end IS NOT NULL",
    "gpu_metrics": "SELECT count(*) FROM GPU_METRICS",
}


def _count(db: Path, sql: str) -> int:
    con = sqlite3.connect(db)
    try:
        return con.execute(sql).fetchone()[0]
    except sqlite3.OperationalError:
        return 0
    finally:
        con.close()


def _fingerprint(store: Path) -> dict[str, tuple]:
    con = duckdb.connect(str(store), read_only=True)
    out = {t: con.execute(f'SELECT count(*), sum(hash(COLUMNS(*))) FROM {t}').fetchone()
           for t in [*TABLES, "env"]}
    out["ranks"] = con.execute("SELECT list(rank ORDER BY rank), list(status ORDER BY rank) FROM ranks").fetchone()
    con.close()
    return out


@pytest.mark.parametrize("engine", ["scanner", "sqlite3"])
def test_counts_and_one_clock(gpu_fixtures: Path, tmp_path: Path, engine: str) -> None:
    files = sorted((gpu_fixtures / "ddp_straggler").glob("*.sqlite"))
    res = collect([gpu_fixtures / "ddp_straggler"], tmp_path, layout=Layout(), engine=engine, workers=2)
    assert res.engine == engine and res.ok_ranks == [0, 1]
    con = duckdb.connect(str(res.store), read_only=True)
    starts = [_count(f, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME") for f in files]
    base = min(starts)
    for rank, f in enumerate(files):
        for table, sql in TABLES.items():
            got = con.execute(f"SELECT count(*) FROM {table} WHERE rank = ?", [rank]).fetchone()[0]
            assert got == _count(f, sql), (rank, table)
        raw = _count(f, "SELECT min(start) FROM CUPTI_ACTIVITY_KIND_KERNEL")
        got = con.execute("SELECT min(start) FROM kernels WHERE rank = ?", [rank]).fetchone()[0]
        assert got == raw + starts[rank] - base  # ns since the earliest session start
        row = con.execute("SELECT session_start_utc_ns, clock_offset_ns, host, gpu_name, nsys_version, status "
                          "FROM ranks WHERE rank = ?", [rank]).fetchone()
        assert row == (starts[rank], starts[rank] - base, "vm", "NVIDIA H200", "2025.3.2.0", "ok")
    # No classification is stored (analysis classifies NCCL kernels by name): the store's
    # columns are exactly the registry's.
    from orchestrator.store.tables import TABLES as REGISTRY

    for name, t in REGISTRY.items():
        cols = [r[0] for r in con.execute(f"DESCRIBE {name}").fetchall()]
        assert cols == [c for c, _ in t.store_columns] and "category" not in cols
    assert con.execute("SELECT count(DISTINCT metric) FROM gpu_metrics WHERE rank = 0").fetchone()[0] > 10
    con.close()


def test_engines_build_identical_stores(gpu_fixtures: Path, tmp_path: Path) -> None:
    a = collect([gpu_fixtures / "pp_imbalance"], tmp_path / "a", layout=Layout(), engine="scanner")
    b = collect([gpu_fixtures / "pp_imbalance"], tmp_path / "b", layout=Layout(), engine="sqlite3")
    assert _fingerprint(a.store) == _fingerprint(b.store)


def test_identity_from_inside_the_report(gpu_fixtures: Path, tmp_path: Path) -> None:
    """Files named only <name>_%h.%p (the seed sbatch) get their rank from RANK captured
    in META_DATA_CAPTURE; here rank 1 sorts first by name, so file order would be wrong."""
    src = tmp_path / "src"
    src.mkdir()
    for f in sorted((gpu_fixtures / "ddp_straggler").glob("*.sqlite")):
        rank = f.name.split("_r")[1][0]
        shutil.copy(f, src / f"profile_{'a' if rank == '1' else 'b'}host.{1000 + int(rank)}.sqlite")
    res = collect([src], tmp_path / "run", layout=Layout())
    assert res.warnings == []
    con = duckdb.connect(str(res.store), read_only=True)
    rows = con.execute("SELECT rank, host, pid, identity_source FROM ranks ORDER BY rank").fetchall()
    assert rows == [(0, "bhost", 1000, "captured env"), (1, "ahost", 1001, "captured env")]


def test_sqlite_gz_input_directly(tmp_path: Path) -> None:
    res = collect([h200_fixtures() / "ddp_capture"], tmp_path, layout=Layout())
    assert res.ok_ranks == [0, 1]
    assert len(list((tmp_path / "exports").glob("*.sqlite"))) == 2


def _bad_files(gpu_fixtures: Path, d: Path) -> None:
    good = sorted((gpu_fixtures / "ddp_straggler").glob("*.sqlite"))
    d.mkdir()
    shutil.copy(good[0], d / "job_1_r0_vm.1.sqlite")
    shutil.copy(good[1], d / "job_1_r1_vm.2.sqlite")
    shutil.copy(good[1], d / "job_1_r1_vm.9.sqlite")  # a second report claiming rank 1
    (d / "job_1_r2_vm.3.sqlite").write_bytes(b"")  # zero bytes
    (d / "job_1_r3_vm.4.sqlite").write_bytes(good[0].read_bytes()[: 200_000])  # truncated
    (d / "job_1_r4_vm.5.sqlite").write_text("this is not a database\n" * 100)
    other = sqlite3.connect(d / "job_1_r5_vm.6.sqlite")  # SQLite of another program
    other.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    other.commit()
    other.close()
    shutil.copy(good[0], d / "job_1_r6_vm.7.sqlite")  # kernel table without its shortName column
    con = sqlite3.connect(d / "job_1_r6_vm.7.sqlite")
    con.execute("ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN shortName")
    con.commit()
    con.close()
    (d / "job_1_r8_vm.8.sqlite.gz").write_bytes(b"\x1f\x8b\x08\x00broken")  # corrupt gzip
    shutil.copy(good[0], d / "job_1_r7_vm.10.sqlite")  # readable, but a value of the wrong type
    con = sqlite3.connect(d / "job_1_r7_vm.10.sqlite")
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'not a time' WHERE rowid = 5")
    con.commit()
    con.close()


def test_bad_exports_are_marked_good_ranks_collected(gpu_fixtures: Path, tmp_path: Path) -> None:
    _bad_files(gpu_fixtures, tmp_path / "in")
    res = collect([tmp_path / "in"], tmp_path / "run", layout=Layout(world_size=10), expected=list(range(10)))
    assert res.ok_ranks == [0, 1, 6]
    assert res.missing == [2, 3, 4, 5, 7, 8, 9]
    con = duckdb.connect(str(res.store), read_only=True)
    status = dict(con.execute("SELECT rank, status || ': ' || coalesce(error, '') FROM ranks").fetchall())
    assert "empty file" in status[2]
    assert "truncated or corrupt" in status[3] or "unreadable" in status[3]
    assert "not a SQLite file" in status[4]
    assert "not an Nsight Systems export" in status[5]
    assert status[6].startswith("partial") and "CUPTI_ACTIVITY_KIND_KERNEL.shortName" in status[6]
    n, named = con.execute("SELECT count(*), count(short_name) FROM kernels WHERE rank = 6").fetchone()
    assert n > 0 and named == 0  # the missing column is NULL, the rows are kept
    assert "decompress" in status[8]
    assert status[7].startswith("error") and "ingest failed" in status[7]  # its batch was retried alone
    assert con.execute("SELECT count(*) FROM kernels WHERE rank = 7").fetchone()[0] == 0
    assert status[9].startswith("missing")
    from orchestrator.analyze.build import build_report
    from orchestrator.metrics.engine import Options

    rep = build_report(res.store, Options()).model_dump()
    assert rep["missing_ranks"] == [9]
    assert {p["rank"] for p in rep["problems"] if p["status"] == "error"} == {2, 3, 4, 5, 7, 8}
    dup = con.execute("SELECT status, reason FROM sources WHERE file LIKE '%vm.9.sqlite'").fetchone()
    assert dup[0] == "duplicate" and "already claimed" in dup[1]
    # Only the good copy of rank 1 is in the event tables.
    assert con.execute("SELECT count(*) FROM kernels WHERE rank = 1").fetchone()[0] == \
        _count(gpu_fixtures / "ddp_straggler" / sorted(p.name for p in (gpu_fixtures / "ddp_straggler").iterdir())[1],
               TABLES["kernels"])


def test_secrets_dropped_unless_keep_env(gpu_fixtures: Path, tmp_path: Path) -> None:
    secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY"
    src = copies_with_env(sorted((gpu_fixtures / "ddp_capture").glob("*.sqlite")), tmp_path / "src",
                          f'AWS_SECRET_ACCESS_KEY="{secret}"', "HF_TOKEN=hf_abc1")
    res = collect([src], tmp_path / "run", layout=Layout())
    con = duckdb.connect(str(res.store), read_only=True)
    names = {r[0] for r in con.execute("SELECT name FROM env").fetchall()}
    assert {"RANK", "LOCAL_RANK", "WORLD_SIZE"} <= names and "AWS_SECRET_ACCESS_KEY" not in names
    con.close()
    assert secret.encode() not in res.store.read_bytes()
    kept = collect([src], tmp_path / "keep", layout=Layout(), keep_env=True)
    con = duckdb.connect(str(kept.store), read_only=True)
    kept_value = con.execute("SELECT value FROM env WHERE name = 'AWS_SECRET_ACCESS_KEY' AND rank = 0").fetchone()
    assert kept_value == (secret,)
    con.close()
    assert secret.encode() in kept.store.read_bytes()  # so the byte check above can fail


def test_idempotent_locked_and_recovers_from_interruption(gpu_fixtures: Path, tmp_path: Path) -> None:
    src = gpu_fixtures / "ddp_capture"
    first = collect([src], tmp_path, layout=Layout())
    fp = _fingerprint(first.store)
    assert _fingerprint(collect([src], tmp_path, layout=Layout()).store) == fp
    # A concurrent collect of the same run fails at once with a clear message.
    with run_lock(tmp_path):
        p = run_orch("collect", "--from", str(src), "--out", str(tmp_path))
        assert p.returncode == 2 and "another `orch collect`" in p.stderr and len(p.stderr.splitlines()) == 1
    # A collect killed mid-way leaves only a temp file; the store is untouched and the next run works.
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "collect", "--from", str(src),
                             "--out", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc.kill()
    proc.wait()
    (tmp_path / ".profile.duckdb.tmp-999999").write_bytes(b"half a store")
    assert _fingerprint(first.store) == fp
    assert _fingerprint(collect([src], tmp_path, layout=Layout()).store) == fp
    assert os.path.exists(tmp_path / "profile.duckdb")


def test_real_nsys_2022_export_without_cuda(tmp_path: Path, nsys: str) -> None:
    """A CPU-only capture by Debian's nsys 2022.4: exported by orch with `nsys export`,
    no META_DATA_CAPTURE and no CUPTI tables -> empty tables and notes, never a crash."""
    reports = tmp_path / "reports"
    reports.mkdir()
    for rank in (0, 1):
        capture_cpu(nsys, "import nvtx, time\nfor i in range(3):\n    nvtx.push_range(f'step {i}')\n"
                    "    with nvtx.annotate('data_load'):\n        time.sleep(0.005)\n    nvtx.pop_range()\n",
                    reports / f"cpu_7_r{rank}_%h.%p", env={"RANK": str(rank)})
    res = collect([reports], tmp_path / "run", layout=Layout(), nsys=nsys)
    assert res.ok_ranks == [0, 1] and [m.source for m in res.members] == ["file name", "file name"]
    con = duckdb.connect(str(res.store), read_only=True)
    rows = con.execute("SELECT rank, status, nsys_version, schema_version, error FROM ranks ORDER BY rank").fetchall()
    assert [r[0] for r in rows] == [0, 1]
    for _rank, status, version, schema, error in rows:
        assert status == "partial" and version.startswith("2022.4") and schema == "3.0.0"
        assert "CUPTI_ACTIVITY_KIND_KERNEL" in error and "kernels" in error and "no META_DATA_CAPTURE" in error
    assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM nvtx WHERE text = 'data_load'").fetchone()[0] == 6
    assert con.execute("SELECT max(depth) FROM nvtx WHERE text = 'data_load'").fetchone()[0] == 1
    # Raw reports were not touched; exports went to the run directory.
    assert sorted(p.suffix for p in reports.iterdir()) == [".nsys-rep", ".nsys-rep"]
    assert len(list((tmp_path / "run" / "exports").glob("*.sqlite"))) == 2
    # nsys 2022.4 rejects --include-json and --tables: asked again without them, and remembered
    from orchestrator.collect.gather import _REJECTED

    assert _REJECTED[str(shutil.which(nsys))] == {"--include-json", "--tables"}


def test_align_clocks_on_collective_ends(gpu_fixtures: Path, tmp_path: Path) -> None:
    """--align-clocks: matched NCCL kernels end together after the correction (independent
    check: k-th AllReduce ends per rank from the store), and the correction is stored."""
    res = collect([gpu_fixtures / "ddp_straggler"], tmp_path, layout=Layout(), align=True)
    con = duckdb.connect(str(res.store), read_only=True)
    corr = dict(con.execute("SELECT rank, clock_correction_ns FROM ranks").fetchall())
    assert set(corr) == {0, 1} and any(v != 0 for v in corr.values())
    assert all(abs(v) < 1_000_000 for v in corr.values())  # session clocks were already within 1 ms
    ends = con.execute("""
        SELECT rank, list("end" ORDER BY start) FROM kernels
        WHERE short_name = 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL' GROUP BY rank ORDER BY rank""").fetchall()
    diffs = sorted(abs(a - b) for a, b in zip(ends[0][1], ends[1][1], strict=True))
    raw = collect([gpu_fixtures / "ddp_straggler"], tmp_path / "raw", layout=Layout())
    con2 = duckdb.connect(str(raw.store), read_only=True)
    ends2 = con2.execute("""
        SELECT rank, list("end" ORDER BY start) FROM kernels
        WHERE short_name = 'ncclDevKernel_AllReduce_Sum_bf16_RING_LL' GROUP BY rank ORDER BY rank""").fetchall()
    diffs2 = sorted(abs(a - b) for a, b in zip(ends2[0][1], ends2[1][1], strict=True))
    assert diffs[len(diffs) // 2] <= diffs2[len(diffs2) // 2]  # median end mismatch does not grow
    assert diffs[len(diffs) // 2] < 20_000  # and is within 20 us


def test_exports_reused_when_newer_than_report(tmp_path: Path, nsys: str) -> None:
    """A report is exported once; a second collect reuses the export (same file, same mtime),
    and an export next to its report that is newer than it is used without running nsys."""
    reports = tmp_path / "reports"
    reports.mkdir()
    capture_cpu(nsys, "import nvtx\nwith nvtx.annotate('step 0'):\n    pass\n", reports / "x_1_r0_h.1", trace="nvtx")
    collect([reports], tmp_path / "run", layout=Layout(), nsys=nsys)
    export = tmp_path / "run" / "exports" / "x_1_r0_h.1.sqlite"
    first = export.stat().st_mtime_ns
    collect([reports], tmp_path / "run", layout=Layout(), nsys=nsys)
    assert export.stat().st_mtime_ns == first
    shutil.copy(export, reports / "x_1_r0_h.1.sqlite")  # newer than the .nsys-rep beside it
    res = collect([reports], tmp_path / "run2", layout=Layout(), nsys="/nonexistent/nsys")
    assert res.ok_ranks == [0] and not (tmp_path / "run2" / "exports" / "x_1_r0_h.1.sqlite").exists()


def test_new_tables_osrt_threads_sync(gpu_fixtures: Path, tmp_path: Path, nsys: str) -> None:
    """osrt, threads and sync against plain sqlite3 over the exports: the real H200 exports
    (nsys 2025.3) and a real nsys 2022.4 CPU capture (no CUPTI: sync untraced, not an error)."""
    from orchestrator.store.tables import OSRT_MIN_NS

    files = sorted((gpu_fixtures / "ddp_straggler").glob("*.sqlite"))
    res = collect([gpu_fixtures / "ddp_straggler"], tmp_path / "gpu", layout=Layout())
    con = duckdb.connect(str(res.store), read_only=True)
    for rank, f in enumerate(files):
        raw = sqlite3.connect(f)
        want_osrt = raw.execute(f"SELECT count(*), sum(end - start) FROM OSRT_API WHERE end - start >= {OSRT_MIN_NS}"
                                ).fetchone()
        want_sync = dict(raw.execute("SELECT e.name, count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION s "
                                     "JOIN ENUM_CUPTI_SYNC_TYPE e ON e.id = s.syncType GROUP BY 1").fetchall())
        want_threads = dict(raw.execute("SELECT t.globalTid, s.value FROM ThreadNames t "
                                        "JOIN StringIds s ON s.id = t.nameId").fetchall())
        raw.close()
        got = con.execute('SELECT count(*), sum("end" - start) FROM osrt WHERE rank = ?', [rank]).fetchone()
        assert got == want_osrt
        got_sync = dict(con.execute("SELECT sync_type, count(*) FROM sync WHERE rank = ? GROUP BY 1",
                                    [rank]).fetchall())
        assert {("CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_" + k.upper()): v for k, v in got_sync.items()} == want_sync
        threads = dict(con.execute("SELECT tid, name FROM threads WHERE rank = ?", [rank]).fetchall())
        assert threads == want_threads
        assert con.execute("SELECT count(*) FROM threads WHERE rank = ? AND process = 'python' AND name = 'python'",
                           [rank]).fetchone()[0] >= 1
        # GPU metrics were sampled by local rank 0 only; --cuda-memory-usage was off on both and
        # no CUDA graph ran (tables present only with that option or that work).
        untraced = set(filter(None, con.execute("SELECT untraced FROM ranks WHERE rank = ?",
                                                [rank]).fetchone()[0].split(",")))
        assert untraced - {"gpu_memory", "graph_execs"} == (set() if rank == 0 else {"gpu_metrics"})
        assert "gpu_memory" in untraced
    con.close()
    # nsys 2022.4, CPU only: OSRT and thread names are there, CUPTI tables are not.
    reports = tmp_path / "reports"
    reports.mkdir()
    capture_cpu(nsys, "import threading, time\nt = threading.Thread(target=time.sleep, args=(0.05,))\nt.start()\n"
                "for _ in range(3):\n    time.sleep(0.01)\nt.join()\n", reports / "cpu_1_r0_h.1")
    res = collect([reports], tmp_path / "cpu", layout=Layout(), nsys=nsys)
    export = tmp_path / "cpu" / "exports" / "cpu_1_r0_h.1.sqlite"
    raw = sqlite3.connect(export)
    want = raw.execute(f"SELECT count(*), sum(end - start) FROM OSRT_API WHERE end - start >= {OSRT_MIN_NS}").fetchone()
    n_threads = raw.execute("SELECT count(DISTINCT globalTid) FROM ThreadNames").fetchone()[0]
    raw.close()
    con = duckdb.connect(str(res.store), read_only=True)
    assert want[0] > 0 and con.execute('SELECT count(*), sum("end" - start) FROM osrt').fetchone() == want
    assert con.execute("SELECT count(*) FROM threads").fetchone()[0] == n_threads > 0
    assert con.execute("SELECT count(*) FROM sync").fetchone()[0] == 0
    untraced = con.execute("SELECT untraced FROM ranks").fetchone()[0].split(",")
    assert {"kernels", "sync", "gpu_metrics"} <= set(untraced) and "osrt" not in untraced
    con.close()
