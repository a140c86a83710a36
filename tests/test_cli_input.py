"""Bad CLI and spec input through the real CLI: exit 2, one line naming the problem and the fix,
no traceback, and nothing written. Also the new input behaviour: partial layouts, range-checked
report names, the typed manifest."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.runpaths import MANIFEST
from tests.conftest import EXAMPLES, run_orch

pytestmark = pytest.mark.replay

SPEC = {"name": "t", "cluster": "local", "launch": {"script": str(EXAMPLES / "train.py"), "nproc_per_node": 2}}


def _one_line_error(p, *needles: str) -> str:
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert "Traceback" not in p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("orch: error: "), p.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _listing(d: Path) -> list[str]:
    return sorted(str(p.relative_to(d)) for p in d.rglob("*"))


# ---------------------------------------------------------------- job spec


@pytest.mark.parametrize("text, needles", [
    ("name: a\nname: b\nlaunch: {script: train.py}\n", ["line 2", "'name'", "appears twice", "keep one"]),
    ("name: a\nlaunch:\n  script: train.py\n  nproc_per_node: 2\n  nproc_per_node: 4\n",
     ["line 5", "'nproc_per_node'", "appears twice"]),
    ("name: a\nlaunch: {script: train.py, nproc_per_node: true}\n",
     ["launch.nproc_per_node", "true/false is not a number", "fix this value"]),
    ("name: a\nslurm: {nodes: true}\nlaunch: {script: train.py}\n", ["slurm.nodes", "true/false"]),
    ("name: a\nlayout: {pp: true}\nlaunch: {script: train.py}\n", ["layout", "pp"]),
    ("name: a\nslurm: {container_exec: \"apptainer exec 'img.sif\"}\nlaunch: {script: train.py}\n",
     ["slurm.container_exec", "unbalanced quote", "close it"]),
])
def test_bad_spec_text(tmp_path: Path, text: str, needles: list[str]) -> None:
    shutil.copy(EXAMPLES / "train.py", tmp_path / "train.py")
    (tmp_path / "job.yaml").write_text(text)
    for cmd in (["validate", "job.yaml"], ["render", "job.yaml", "-o", "out"]):
        _one_line_error(run_orch(*cmd, cwd=tmp_path), *needles)
    assert _listing(tmp_path) == ["job.yaml", "train.py"]


def test_a_local_jobs_python_without_torch_fails_before_any_job(tmp_path: Path) -> None:
    """The shell's python3 where the training virtualenv is not activated: `orch submit` on this
    machine checks the job's python first and says, in one line, which python lacks torch and
    where to name another, with no run directory made and no job started."""
    import sys

    bare = tmp_path / "bare-python"  # this python without its site-packages: no torch
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    bare.chmod(0o755)
    for python, needles in ((str(bare), ["`" + str(bare) + "`", "has no torch", "`launch.python` in the job file",
                                         f"orch's own has it: {sys.executable}"]),
                            ("no-such-python-3.99", ["`no-such-python-3.99` is not on this machine's PATH"])):
        spec = {**SPEC, "run_root": str(tmp_path / "runs"), "launch": {**SPEC["launch"], "python": python}}
        (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
        _one_line_error(run_orch("submit", "job.yaml", cwd=tmp_path), *needles)
        assert not (tmp_path / "runs").exists()


def test_partial_layout_in_spec_infers_dp(tmp_path: Path) -> None:
    spec = {**SPEC, "launch": {**SPEC["launch"], "nproc_per_node": 4}, "layout": {"pp": 2}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    p = run_orch("validate", str(tmp_path / "job.yaml"))
    assert p.returncode == 0 and "layout tp=1 pp=2 dp=2" in p.stdout, p.stdout + p.stderr
    spec["layout"] = {"pp": 3}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    _one_line_error(run_orch("validate", str(tmp_path / "job.yaml")), "tp*pp = 3 does not divide the world size 4",
                    "fix layout")


# ---------------------------------------------------------------- numeric flags


@pytest.mark.parametrize("args, needles", [
    (["--gap-ms", "nan"], ["--gap-ms", "'nan'", "finite number > 0", "e.g. --gap-ms 1"]),
    (["--gap-ms", "inf"], ["--gap-ms", "'inf'"]),
    (["--gap-ms", "0"], ["--gap-ms", "'0'"]),
    (["--gap-ms", "-3"], ["--gap-ms", "'-3'"]),
    (["--workers", "0"], ["--workers", "from 1 to 64"]),
    (["--workers", "-1"], ["--workers", "'-1'"]),
    (["--workers", "100000"], ["--workers", "'100000'", "e.g. --workers 4"]),
    (["--layout", "pp=2,pp=2"], ["--layout", "at most once"]),
    (["--layout", "pp=0"], ["--layout", "positive integers"]),
])
def test_bad_numbers_fail_before_any_work(gpu_fixtures: Path, tmp_path: Path, args: list[str],
                                          needles: list[str]) -> None:
    out = tmp_path / "store"
    p = run_orch("analyze", str(gpu_fixtures / "ddp_capture"), "--out", str(out), "--json",
                 str(tmp_path / "r.json"), *args)
    _one_line_error(p, *needles)
    assert _listing(tmp_path) == []


def test_diff_threshold_scale_nan(tmp_path: Path) -> None:
    _one_line_error(run_orch("diff", "a.json", "b.json", "--threshold-scale", "nan", cwd=tmp_path),
                    "--threshold-scale", "finite number > 0")


# ---------------------------------------------------------------- output paths


def test_output_paths_checked_up_front(gpu_fixtures: Path, tmp_path: Path) -> None:
    src = str(gpu_fixtures / "ddp_capture")
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("keep me")
    cases = [
        (["analyze", src, "--json", str(tmp_path / "adir")], ["--json", "is a directory", "give a file name"]),
        (["analyze", src, "--html", str(tmp_path / "adir")], ["--html", "is a directory"]),
        (["analyze", src, "--json", str(tmp_path / "no" / "such" / "r.json")],
         ["--json", "does not exist", "create it first"]),
        (["analyze", src, "--json", "/proc/orch-report.json"], ["--json", "cannot write in /proc",
                                                                 "choose a writable location"]),
        (["analyze", src, "--json", "/sys/orch-report.json"], ["--json", "cannot write in /sys"]),
        (["analyze", src, "--out", str(tmp_path / "afile")], ["--out", "is a file, not a directory"]),
        (["collect", "--from", src, "--out", str(tmp_path / "afile")], ["--out", "is a file"]),
        (["collect", "--from", src, "--out", str(tmp_path / "afile" / "sub")], ["--out", "is a file"]),
        (["report", str(tmp_path), "--json", str(tmp_path / "adir")], ["--json", "is a directory"]),
        (["diff", "a.json", "b.json", "--json", str(tmp_path / "adir")], ["--json", "is a directory"]),
        (["export-trace", "x", "-o", str(tmp_path / "adir")], ["-o", "is a directory"]),
        (["redact", "x.sqlite", "-o", str(tmp_path / "afile")], ["-o", "is a file"]),
    ]
    for args, needles in cases:
        _one_line_error(run_orch(*args, cwd=tmp_path), *needles)
        assert _listing(tmp_path) == ["adir", "afile"], args  # no store, no half-written output
        assert (tmp_path / "afile").read_text() == "keep me"


def test_json_inside_a_new_out_dir_is_fine(gpu_fixtures: Path, tmp_path: Path) -> None:
    """`--out D --json D/r.json`: D does not exist yet, analyze creates it first."""
    d = tmp_path / "new"
    p = run_orch("analyze", str(gpu_fixtures / "ddp_capture"), "--out", str(d), "--json", str(d / "r.json"))
    assert p.returncode == 0, p.stderr
    assert json.loads((d / "r.json").read_text())["ranks"]


# ---------------------------------------------------------------- analyze keeps its store


def test_analyze_keeps_temp_store_when_the_analysis_fails(gpu_fixtures: Path, tmp_path: Path, capsys,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The collect is real; the analysis is made to fail (fault injection: no real input fails
    it reliably once the analysis validates its own options). The store must survive, named,
    and complete: the analysis fails while the store's checkpoint runs (collect.collecting)."""
    import duckdb

    import orchestrator.analyze.build as report_mod
    from orchestrator.errors import OrchError

    def broken(store, opts, writer=None, **_):
        assert writer is not None  # the analysis would have run on the collect's connection
        raise OrchError("analysis failed on the store: planted")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(report_mod, "build_analysis", broken)
    code = main(["analyze", str(gpu_fixtures / "ddp_capture"), "--json", str(tmp_path / "r.json")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    (kept,) = tmp_path.glob("orch-analyze-*/profile.duckdb")
    assert "planted" in err and f"the collected store is kept in {kept}" in err
    assert not (tmp_path / "r.json").exists()
    assert not kept.with_name(kept.name + ".wal").exists()  # checkpointed, closed
    con = duckdb.connect(str(kept), read_only=True)
    assert con.execute("SELECT count(DISTINCT rank) FROM kernels").fetchone() == (2,)
    con.close()


def test_analyze_removes_temp_store_on_success(gpu_fixtures: Path, tmp_path: Path, capsys,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert main(["analyze", str(gpu_fixtures / "ddp_capture"), "--json", str(tmp_path / "r.json")]) == 0
    assert _listing(tmp_path) == ["r.json"]


def test_report_of_a_folder_without_a_store_says_how_to_make_one(tmp_path: Path, capsys) -> None:
    (tmp_path / "out").mkdir()
    assert main(["report", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"orch: error: {tmp_path / 'out'} holds no profile.duckdb and is not an orch run; collect into "
                   f"it first (`orch collect --from REPORTS --out {tmp_path / 'out'}`) or give a job id"), err


# ---------------------------------------------------------------- diff of non-reports


@pytest.mark.parametrize("content", ['{"a": 1}', "[1, 2]", '"text"', '{"schema_version": 1}', "not json",
                                     '{"schema_version": 1, "ranks": 3}'])
def test_diff_of_a_json_that_is_not_a_report(tmp_path: Path, content: str) -> None:
    (tmp_path / "x.json").write_text(content)
    _one_line_error(run_orch("diff", str(tmp_path / "x.json"), str(tmp_path / "x.json"), "--json",
                             str(tmp_path / "d.json")), "is not a report JSON", "orch report --json")
    assert not (tmp_path / "d.json").exists()


# ---------------------------------------------------------------- layouts and names in collect


def _stages(store: Path) -> list[tuple[int, int | None]]:
    import duckdb

    con = duckdb.connect(str(store), read_only=True)
    try:
        return con.execute("SELECT rank, stage FROM ranks ORDER BY rank").fetchall()
    finally:
        con.close()


def test_partial_layout_infers_dp_from_the_ranks_found(gpu_fixtures: Path, tmp_path: Path) -> None:
    p = run_orch("collect", "--from", str(gpu_fixtures / "pp_imbalance"), "--out", str(tmp_path / "s"),
                 "--layout", "pp=2")
    assert p.returncode == 0, p.stderr
    assert "dp=1 inferred from a world size of 2" in p.stderr
    assert _stages(tmp_path / "s" / "profile.duckdb") == [(0, 0), (1, 1)]  # both stages kept
    bad = run_orch("collect", "--from", str(gpu_fixtures / "pp_imbalance"), "--out", str(tmp_path / "t"),
                   "--layout", "pp=3")
    _one_line_error(bad, "--layout", "tp*pp = 3 does not divide the world size 2", "dp=N")
    assert not (tmp_path / "t" / "profile.duckdb").exists()


def test_huge_numbers_in_report_names_are_no_rank(gpu_fixtures: Path, tmp_path: Path) -> None:
    """A 20-digit rank or pid in a file name does not raise: the rank comes from the report's
    captured environment instead."""
    src = tmp_path / "in"
    src.mkdir()
    files = sorted((gpu_fixtures / "ddp_capture").glob("*.sqlite"))
    shutil.copy(files[0], src / "x_1_r99999999999999999999_h.1.sqlite")
    shutil.copy(files[1], src / "x_1_r1_h.12345678901234567890.sqlite")
    p = run_orch("collect", "--from", str(src), "--out", str(tmp_path / "s"))
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert "2 rank(s) ok" in p.stdout, p.stdout
    assert [r for r, _ in _stages(tmp_path / "s" / "profile.duckdb")] == [0, 1]


# ---------------------------------------------------------------- manifests


def _manifest(run: Path, **over: object) -> dict:
    m = {"orch_version": "0.0.1", "name": "old", "job_id": "4000000000", "executor": "local",
         "cluster": "local", "submitted_at": "2024-01-01T00:00:00+00:00", "nodes": 1, "nproc_per_node": 2,
         "world_size": 2, "layout": {"tp": 1, "pp": 1, "dp": 2}, "profiled_ranks": [0],
         "output_name": "old", "report_dir": str(run / "reports"), "report_pattern": "x",
         "expected_reports": [{"rank": 0, "node": 0, "glob": str(run / "reports" / "old_4000000000_r0_*.nsys-rep")}],
         "submitit_folder": str(run / "submitit"), "a_key_from_the_future": {"x": 1}}
    m.update(over)
    run.mkdir(parents=True, exist_ok=True)
    (run / MANIFEST).write_text(json.dumps(m))
    return m


def test_old_manifest_with_unknown_keys_reads(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _manifest(run)
    p = run_orch("status", str(run))
    assert p.returncode == 0, p.stderr
    assert "job 4000000000 (old, local)" in p.stdout and "rank 0: no report (its task's log says why)" in p.stdout


@pytest.mark.parametrize("text, needle", [("{not json", "corrupt (not JSON)"),
                                          ('{"name": "x"}', "corrupt (orch_version")])
def test_corrupt_manifest_is_one_line(tmp_path: Path, text: str, needle: str) -> None:
    (tmp_path / MANIFEST).write_text(text)
    for cmd in ("status", "cancel", "collect"):
        _one_line_error(run_orch(cmd, str(tmp_path)), needle, "restore it or resubmit")


@pytest.mark.parametrize("value", ["lots", "1 GB of RAM", "-1GB", ""])
def test_bad_memory_limit_fails_before_any_work(gpu_fixtures: Path, tmp_path: Path, value: str) -> None:
    p = run_orch("analyze", str(gpu_fixtures / "ddp_capture"), "--out", str(tmp_path / "store"),
                 env={"ORCH_DUCKDB_MEMORY": value})
    _one_line_error(p, "ORCH_DUCKDB_MEMORY", "ORCH_DUCKDB_MEMORY=4GB")
    assert _listing(tmp_path) == []


def test_a_memory_cap_too_small_for_the_store_says_so_in_one_line(gpu_fixtures: Path, tmp_path: Path) -> None:
    """DuckDB out of the memory orch gives it (a real 1MB cap on a real store) is no traceback and
    no `re-run orch collect`: the message names ORCH_DUCKDB_MEMORY, and no partial output stays."""
    run = tmp_path / "run"
    assert run_orch("collect", "--from", str(gpu_fixtures / "ddp_straggler"), "--out", str(run)).returncode == 0
    before = _listing(tmp_path)
    for args in (["report", str(run), "--json", str(tmp_path / "r.json")],
                 ["export-trace", str(run), "-o", str(tmp_path / "t.pftrace")]):
        line = _one_line_error(run_orch(*args, env={"ORCH_DUCKDB_MEMORY": "1MB"}),
                               "DuckDB ran out of the 1MB of memory", "set ORCH_DUCKDB_MEMORY higher")
        assert "re-run" not in line  # not the rebuild-the-store advice
        assert _listing(tmp_path) == before


def test_memory_limit_reaches_the_analysis(gpu_fixtures: Path, tmp_path: Path, monkeypatch) -> None:
    """The analysis connection is capped (the 512-rank report peaked at 3.9 GB without it) and
    spills under the system temp directory, never into the working directory."""
    from orchestrator.collect.collect import collect
    from orchestrator.collect.identity import Layout
    from orchestrator.metrics.engine import attach_store

    res = collect([gpu_fixtures / "ddp_capture"], tmp_path / "run", layout=Layout(), workers=1)
    monkeypatch.setenv("ORCH_DUCKDB_MEMORY", "300MB")
    con = attach_store(res.store)
    try:
        limit, spill = con.execute("SELECT current_setting('memory_limit'), current_setting('temp_directory')"
                                   ).fetchone()
    finally:
        con.close()
    assert limit in ("286.1 MiB", "300.0 MB"), limit
    assert Path(spill).parent == Path(tempfile.gettempdir()) and Path(spill).name.startswith("orch-spill-")


@pytest.mark.parametrize("value", ["many", "0", "-2", "1.5", "99999"])
def test_bad_thread_cap_fails_before_any_work(gpu_fixtures: Path, tmp_path: Path, value: str) -> None:
    p = run_orch("analyze", str(gpu_fixtures / "ddp_capture"), "--out", str(tmp_path / "store"),
                 env={"ORCH_DUCKDB_THREADS": value})
    _one_line_error(p, "ORCH_DUCKDB_THREADS", "ORCH_DUCKDB_THREADS=4")
    assert _listing(tmp_path) == []


def test_thread_cap_reaches_the_analysis_with_the_same_report(
        gpu_fixtures: Path, tmp_path: Path, monkeypatch) -> None:
    """ORCH_DUCKDB_THREADS caps DuckDB's threads and the files analysed at once where orch would
    take more (a store large enough for 4 threads), not the exports (nsys processes, `--workers`),
    and the report is the one the machine's cores make."""
    from orchestrator.analyze.build import build_report
    from orchestrator.collect.collect import collect
    from orchestrator.collect.gather import export_workers
    from orchestrator.collect.identity import Layout
    from orchestrator.metrics import sqlrun
    from orchestrator.metrics.engine import Options, attach_store

    res = collect([gpu_fixtures / "ddp_straggler"], tmp_path / "run", layout=Layout())
    monkeypatch.delenv("ORCH_DUCKDB_THREADS", raising=False)
    uncapped = build_report(res.store, Options()).model_dump(mode="json")
    monkeypatch.setenv("ORCH_DUCKDB_THREADS", "1")
    con = attach_store(res.store)
    try:
        assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 1
    finally:
        con.close()
    assert sqlrun.workers() == 1 and export_workers(None) == min(8, os.cpu_count() or 2)
    capped = build_report(res.store, Options()).model_dump(mode="json")
    assert capped == uncapped


def test_full_disk_is_one_line_and_keeps_the_old_store(gpu_fixtures: Path, tmp_path: Path) -> None:
    """A store that does not fit (a real 1 MB tmpfs) fails in one line naming the folder and the
    fix, writes no partial store, and blames no rank; an earlier store there is untouched."""
    import subprocess

    disk = tmp_path / "tiny"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
                      capture_output=True, check=False).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        run = disk / "run"
        run.mkdir()
        (run / "profile.duckdb").write_bytes(b"the earlier store")
        p = run_orch("collect", "--from", str(gpu_fixtures / "ddp_capture"), "--out", str(run))
        line = _one_line_error(p, "cannot write the store", "No space left on device", "--out DIR")
        assert "rank" not in line
        assert (run / "profile.duckdb").read_bytes() == b"the earlier store"
        assert not [f.name for f in run.iterdir() if ".tmp-" in f.name or f.name.endswith(".wal")]
    finally:
        subprocess.run(["umount", str(disk)], check=False)
