"""Hostile input: fuzzed job specs, shell injection through every field that reaches a
script (executed for real), path escapes, and secrets in every output."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.cli import main
from tests.conftest import EXAMPLES, copies_with_env, run_orch

pytestmark = pytest.mark.replay

VALID = {
    "name": "fuzz", "cluster": "local",
    "launch": {"script": str(EXAMPLES / "train.py"), "nproc_per_node": 2, "args": ["--steps", "3"]},
    "layout": {"tp": 1, "pp": 1},
    "profile": {"ranks": "all", "trace": ["nvtx", "osrt"]},
}
PATHS = [("name",), ("cluster",), ("launch",), ("launch", "script"), ("launch", "args"), ("launch", "nproc_per_node"),
         ("launch", "env"), ("launch", "rdzv"), ("launch", "rdzv", "port"), ("layout", "tp"), ("layout", "pp"),
         ("layout", "dp"), ("profile",), ("profile", "ranks"), ("profile", "trace"), ("profile", "delay"),
         ("profile", "gpu_metrics"), ("profile", "gpu_metrics", "frequency"), ("profile", "capture_range"),
         ("profile", "output_name"), ("profile", "output_dir"), ("slurm",), ("slurm", "nodes"), ("slurm", "time"),
         ("slurm", "extra_sbatch"), ("bogus_key",), ("profile", "bogus"), ()]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.sampled_from(["all", "none", "0,1", "0-1", "first-per-node", "one-per-stage", "../../etc", "a" * 300,
                     "$(touch /tmp/orch-pwned)", "\x00", "é中🚀", "-1", "99999999999", "nvtx", "cuda"]),
)
values = st.recursive(scalars, lambda kids: st.one_of(st.lists(kids, max_size=4),
                                                      st.dictionaries(st.text(max_size=10), kids, max_size=4)),
                      max_leaves=12)
COUNTS = {"render": 0, "error": 0}


def _mutate(spec: dict, path: tuple, value: object) -> dict:
    spec = json.loads(json.dumps(spec))
    if not path:
        return value if isinstance(value, dict) else spec | {"extra": value}
    node = spec
    for k in path[:-1]:
        if not isinstance(node.get(k), dict):
            node[k] = {}
        node = node[k]
    node[path[-1]] = value
    return spec


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(mutations=st.lists(st.tuples(st.sampled_from(PATHS), values), min_size=1, max_size=3))
def test_fuzzed_specs_render_or_fail_in_one_line(tmp_path_factory, capsys, mutations) -> None:
    tmp = tmp_path_factory.mktemp("fuzz")
    spec = VALID
    for path, value in mutations:
        spec = _mutate(spec, path, value)
    f = tmp / "job.yaml"
    try:
        f.write_text(yaml.safe_dump(spec, allow_unicode=True), encoding="utf-8")
    except (yaml.YAMLError, UnicodeEncodeError):
        return  # not representable as YAML text: nothing a user could write
    out = tmp / "out"
    code = main(["render", str(f), "-o", str(out)])  # any exception here is a traceback: test fails
    err = capsys.readouterr().err
    if code == 0:
        COUNTS["render"] += 1
        assert sorted(p.name for p in (out / "scripts").iterdir()) == [
            "export_report.sh", "keep_report.sh", "launch.sh", "pyhooks", "rank_wrapper.sh", "sbatch.sh"]
    else:
        COUNTS["error"] += 1
        assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("orch: error: "), err
        assert not out.exists()  # nothing half-written


def test_fuzz_counts_reported() -> None:
    """Runs after the fuzz test (file order): it tried 1,000 specs, both outcomes occurred."""
    print(f"fuzz outcomes: {COUNTS}")
    assert COUNTS["render"] + COUNTS["error"] >= 900 and COUNTS["render"] > 0 and COUNTS["error"] > 0


def test_yaml_aliases_and_huge_files_rejected(tmp_path: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8))
    (tmp_path / "bomb.yaml").write_text(bomb)
    p = run_orch("validate", str(tmp_path / "bomb.yaml"))
    assert p.returncode == 2 and "aliases" in p.stderr
    (tmp_path / "big.yaml").write_text("name: x\n" + "#" * (2 << 20))
    p = run_orch("validate", str(tmp_path / "big.yaml"))
    assert p.returncode == 2 and "larger than 1 MiB" in p.stderr


PAYLOADS = ["$(touch {m}/cmdsub)", "`touch {m}/backtick`", "x; touch {m}/semicolon", "x && touch {m}/and",
            "'; touch {m}/quote; '", '"; touch {m}/dquote; "', "$HOME${{IFS}}x", "x | touch {m}/pipe",
            "*", "-rf", "%q{{RANK}}"]


def _recorder(path: Path, then: str = "") -> Path:
    path.write_text('#!/usr/bin/env bash\nprintf "%s\\0" "$@" >> "$ORCH_RECORD"\n' + then)
    path.chmod(0o755)
    return path


# nsys' stand-in records its argv, then starts the program's shell as nsys would (its marker
# written: an nsys that never started it would be a failed start, tried again), with `true` in
# the program's place: its arguments are the payloads, recorded, not run.
NSYS_THEN = 'while [ "$1" != /bin/sh ]; do shift; done\nexec "$1" "$2" "$3" "$4" true\n'


def test_shell_injection_executed_scripts_stay_inert(tmp_path: Path) -> None:
    """Payloads in every string field that reaches a script; the rendered scripts are then
    RUN (wrapper, launch, sbatch with stand-in srun/scontrol/python/nsys that record their
    argv): no payload executes, and each arrives verbatim as one argument."""
    marker = tmp_path / "m"
    marker.mkdir()
    pay = [p.format(m=marker) for p in PAYLOADS]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    rec = _recorder(bindir / "recorder")
    for tool in ("srun", "scontrol"):
        shutil.copy(rec, bindir / tool)
    cluster = tmp_path / "c.yaml"
    nsys = _recorder(bindir / "nsys", NSYS_THEN)
    cluster.write_text(yaml.safe_dump({"name": "c", "executor": "slurm", "python": str(rec),
                                       "nsys": {"path": str(nsys), "version": "2025.3"}}))
    script = f"/opt/{pay[0]}/train.py"  # absolute: not checked for existence
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({
        "name": "inj", "cluster": str(cluster), "slurm": {"nodes": 1},
        "launch": {"script": script, "args": pay, "nproc_per_node": 1,
                   "env": {f"V{i}": p for i, p in enumerate(pay)}},
        "profile": {"ranks": "all", "trace": ["nvtx"], "extra_args": pay[:3],
                    "capture_range": "nvtx", "capture_range_nvtx": pay[1],
                    "output_dir": str(tmp_path / "out $(touch x)")},
    }, allow_unicode=True))
    out = tmp_path / "render"
    p = run_orch("render", str(spec), "-o", str(out))
    assert p.returncode == 0, p.stderr
    scripts = out / "scripts"
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}", "ORCH_RECORD": str(tmp_path / "argv"),
           "RANK": "0", "LOCAL_RANK": "0", "SLURM_JOB_ID": "77", "SLURM_NNODES": "1", "SLURM_NODEID": "0",
           "SLURM_JOB_NODELIST": "node1"}
    for name in ("rank_wrapper.sh", "launch.sh", "sbatch.sh"):
        args = ["bash", str(scripts / name)] + (["python3", "prog.py", *pay] if name == "rank_wrapper.sh" else [])
        r = subprocess.run(args, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, (name, r.stderr)
    assert list(marker.iterdir()) == []  # not one payload ran
    assert not (tmp_path / "x").exists()
    recorded = (tmp_path / "argv").read_text().split("\0")
    for pl in pay:
        assert pl in recorded, pl  # passed through as a single, unchanged argument
    assert script in recorded


@pytest.mark.parametrize("over, needle", [
    ({"name": "../../etc/x"}, "name"),
    ({"name": "/abs"}, "name"),
    ({"name": "a\x00b"}, "name"),
    ({"profile": {"output_name": "../x"}}, "profile.output_name"),
    ({"profile": {"output_name": "a/b"}}, "profile.output_name"),
    ({"profile": {"output_dir": "reports/../../x"}}, "profile.output_dir"),
    ({"profile": {"output_dir": "a\x00b"}}, "profile.output_dir"),
])
def test_names_cannot_escape(tmp_path: Path, over: dict, needle: str) -> None:
    spec = json.loads(json.dumps(VALID))
    for k, v in over.items():
        spec[k] = {**spec.get(k, {}), **v} if isinstance(v, dict) else v
    (tmp_path / "j.yaml").write_text(yaml.safe_dump(spec))
    p = run_orch("render", str(tmp_path / "j.yaml"), "-o", str(tmp_path / "o"))
    assert p.returncode == 2 and needle in p.stderr and not (tmp_path / "o").exists(), p.stderr


def test_secrets_never_reach_outputs(gpu_fixtures: Path, tmp_path: Path) -> None:
    secret = "ghp_SuperSecretToken0123456789abcdef"
    src = copies_with_env(sorted((gpu_fixtures / "ddp_straggler").glob("*.sqlite")), tmp_path / "src",
                          f"GITHUB_TOKEN={secret}")
    for keep in ([], ["--keep-env"]):
        d = tmp_path / f"out{len(keep)}"
        p = run_orch("analyze", str(src), *keep, "--out", str(d), "--json", str(d / "r.json"), "--html",
                     str(d / "r.html"))
        assert p.returncode == 0, p.stderr
        assert run_orch("export-trace", str(d / "profile.duckdb"), "-o", str(d / "t.json")).returncode == 0
        for f in ("r.json", "r.html", "t.json"):
            assert secret not in (d / f).read_text(), (keep, f)
        assert secret not in p.stdout + p.stderr
        assert (secret.encode() in (d / "profile.duckdb").read_bytes()) == bool(keep)


def test_redacted_exports_keep_launcher_env_only(gpu_fixtures: Path, tmp_path: Path) -> None:
    secret = "AKIAIOSFODNN7EXAMPLE-secret-value"
    first = sorted((gpu_fixtures / "ddp_capture").glob("*.sqlite"))[0]
    shutil.copy(first, tmp_path / "x_r0_vm.1.sqlite")
    src = copies_with_env([tmp_path / "x_r0_vm.1.sqlite"], tmp_path / "in", f"AWS_ACCESS_KEY_ID={secret}") / (
        "x_r0_vm.1.sqlite")
    before = src.read_bytes()
    p = run_orch("redact", str(src), "-o", str(tmp_path / "out"))
    assert p.returncode == 0, p.stderr
    assert src.read_bytes() == before  # the input is untouched
    import gzip

    data = gzip.decompress((tmp_path / "out" / "x_r0_vm.1.sqlite.gz").read_bytes())
    assert secret.encode() not in data and b'RANK="0"' in data
    (tmp_path / "plain.sqlite").write_bytes(data)
    con = sqlite3.connect(tmp_path / "plain.sqlite")
    names = {v.split("=")[0] for (v,) in con.execute(
        "SELECT value FROM META_DATA_CAPTURE WHERE name LIKE '%ENVIRONMENT_VARIABLE'")}
    assert names and names <= {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                               "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE"}


@pytest.mark.parametrize("sig", ["SIGINT", "SIGKILL"])
def test_collect_interrupted_midway_then_succeeds(gpu_fixtures: Path, tmp_path: Path, sig: str) -> None:
    """A collect stopped half-way (Ctrl-C or kill -9) leaves the previous store intact, and
    the next collect of the same run succeeds."""
    import signal
    import time

    src = tmp_path / "in"
    src.mkdir()
    good = sorted((gpu_fixtures / "ddp_straggler").glob("*.sqlite"))
    for r in range(24):
        shutil.copy(good[r % 2], src / f"j_1_r{r}_h.{r}.sqlite")
    out = tmp_path / "run"
    first = run_orch("collect", "--from", str(src), "--out", str(out))
    assert first.returncode == 0, first.stderr
    before = (out / "profile.duckdb").read_bytes()
    cmd = [sys.executable, "-m", "orchestrator.cli", "collect", "--from", str(src), "--out", str(out)]
    # Ctrl-C handling as in a terminal even when this test run itself was started in the
    # background (a shell's `cmd &` starts it with SIGINT ignored, which children inherit)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not list(out.glob(".profile.duckdb.tmp-*")) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.02)
    assert proc.poll() is None, "collect finished before it could be interrupted"
    proc.send_signal(getattr(signal, sig))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    if sig == "SIGINT":
        assert "Traceback" not in err and len(err.strip().splitlines()) <= 2, err
        assert not list(out.glob(".profile.duckdb.tmp-*"))  # cleaned up on the way out
    assert (out / "profile.duckdb").read_bytes() == before  # the old store is untouched
    again = run_orch("collect", "--from", str(src), "--out", str(out))
    assert again.returncode == 0 and "24 rank(s) ok" in again.stdout, again.stderr
