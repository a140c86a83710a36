"""Shared fixtures: the real H200 exports, real nsys, and a real throw-away Slurm cluster.

Where a real component is missing, tests skip on a developer machine but FAIL under CI
(CI=true): CI installs everything, so a skip there would hide a broken install step.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.stores import Stores

pytest_plugins = ["tests.stores"]  # the session's shared captures (the `stores` fixture), for every module

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "scripts" / "examples"
# Jobs the tests submit run `python3` from PATH (the spec's default launcher): make it the
# interpreter running the tests (the project's .venv), also when pytest is started by its path.
os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
# Under pytest-xdist the workers already fill the cores: each orch process (in a worker, or one it
# starts) takes its share (ORCH_DUCKDB_THREADS), where more threads than cores only cost CPU:
# on 2 cores a report with one thread spends 13 to 39 % less (docs/benchmarks-code.md).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("ORCH_DUCKDB_THREADS",
                          str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))


def need(condition: bool, why: str) -> None:
    """Skip (fail under CI) when a real component is missing. Also safe where a module calls
    it while pytest collects it (a parametrize list built from files): the skip then covers
    that module, never a collection error."""
    if condition:
        return
    if os.environ.get("CI"):
        pytest.fail(f"required on CI: {why}")
    pytest.skip(why, allow_module_level=True)


H200 = REPO / "tests" / "fixtures" / "h200"


def h200_fixtures() -> Path:
    """The real H200 exports of tests/fixtures/h200 (its README says how they were made)."""
    need(H200.is_dir(), f"{H200} (the real H200 exports) not found: the checkout is incomplete")
    return H200


@pytest.fixture(scope="session")
def gpu_fixtures(stores: Stores) -> Path:
    """The H200 .sqlite.gz exports, decompressed once per session (tests/stores.py, read-only):
    <tmp>/<case>/<file>.sqlite."""
    h200_fixtures()
    return stores.h200()


@pytest.fixture(scope="session")
def nsys() -> str:
    path = shutil.which("nsys")
    need(path is not None, "nsys not installed (scripts/install_system_deps.sh)")
    return path  # type: ignore[return-value]


_NSYS_START_RACES = ("sem_open", "Local Endpoint is not available", "End of file", "The proxy is not started")


def capture_cpu(nsys: str, program: str, out: Path, *, trace: str = "nvtx,osrt",
                env: dict[str, str] | None = None) -> None:
    """A real nsys capture of a small Python `program` on this CPU-only machine: `out` is the
    `-o` name (nsys adds .nsys-rep; `%h`/`%p` allowed), the program is written beside it."""
    prog = out.parent / f".{out.name.replace('%', '_')}.py"
    prog.write_text(program)
    before = set(out.parent.glob("*.nsys-rep"))
    for _ in range(3):
        p = subprocess.Popen([nsys, "profile", f"--trace={trace}", "--sample=none", "--cpuctxsw=none",
                              "-o", str(out), sys.executable, str(prog)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
        _, err = p.communicate(timeout=300)
        if p.returncode != 0:
            reap_agents(p.pid)
        # nsys 2022.4 loses the race with a program that ends at once on a busy machine: its
        # process waiter finds the program's semaphore gone (sem_open) and fails the capture;
        # and with another nsys starting beside it, it may fail before the program starts
        # ("Local Endpoint is not available", "The proxy is not started", or only "End of file"
        # from its agent's connection). orch's rank wrapper starts nsys again then too. It may
        # also exit 0 with no report written (orch's keep_report.sh says "report lost" then).
        made = set(out.parent.glob("*.nsys-rep")) - before
        if p.returncode == 0 and made:
            break
        if p.returncode != 0 and not any(m in err for m in _NSYS_START_RACES):
            break
    prog.unlink()
    assert p.returncode == 0, err
    assert made, f"nsys exited 0 and wrote no report in 3 tries:\n{err}"


def reap_agents(nsys_pid: int) -> None:
    """The agents a failed nsys start left behind, in sessions of their own (`nsys --start-agent
    --session-name=profile-<program>-<nsys pid>`, waiting for a launcher that is gone): stopped, as
    orch's rank wrapper stops them (SIGTERM first: an agent killed outright can leave nsys' session
    table locked)."""
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if any(a.startswith(b"--session-name=profile-") and a.endswith(b"-%d" % nsys_pid) for a in args):
            left.append(int(cmdline.parent.name))
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 5
    while left and time.monotonic() < deadline:
        left = [pid for pid in left if Path(f"/proc/{pid}").exists()]
        time.sleep(0.2)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


_PATHS = {"ranks": {"source_file"}, "sources": {"file"}}  # where the exports were


def store_differences(a: Path, b: Path) -> dict[str, tuple[int, int, int]]:
    """Per table of two stores: (rows, rows only in a, rows only in b), as multisets; the
    columns naming where the exports were and the store's creation time left out."""
    import duckdb

    con = duckdb.connect()
    con.execute(f"ATTACH '{a}' AS a (READ_ONLY)")
    con.execute(f"ATTACH '{b}' AS b (READ_ONLY)")
    listed = "SELECT table_name FROM information_schema.tables WHERE table_catalog = ?"  # views too
    tables = {r[0] for r in con.execute(listed, ["a"]).fetchall()}
    other = {r[0] for r in con.execute(listed, ["b"]).fetchall()}
    assert tables == other
    out = {}
    for t in sorted(tables):
        cols = [r[0] for r in con.execute("SELECT column_name FROM duckdb_columns() WHERE database_name = 'a' "
                                          "AND table_name = ? ORDER BY column_index", [t]).fetchall()]
        sel = ", ".join(f'"{c}"' for c in cols if c not in _PATHS.get(t, set()))
        where = " WHERE key <> 'created_at'" if t == "meta" else ""
        only = [con.execute(f"SELECT count(*) FROM (SELECT {sel} FROM {x}.{t}{where} "
                            f"EXCEPT ALL SELECT {sel} FROM {y}.{t}{where})").fetchone()[0]
                for x, y in (("a", "b"), ("b", "a"))]
        out[t] = (con.execute(f"SELECT count(*) FROM a.{t}").fetchone()[0], only[0], only[1])
    return out


def copies_with_env(files: list[Path], dest: Path, *env: str) -> Path:
    """Copies of exports with extra captured environment entries (e.g. planted secrets)."""
    import sqlite3

    dest.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(f, dest / f.name)
        con = sqlite3.connect(dest / f.name)
        con.executemany("INSERT INTO META_DATA_CAPTURE VALUES ('PROCESS_0:ENVIRONMENT_VARIABLE', ?)",
                        [(e,) for e in env])
        con.commit()
        con.close()
    return dest


def copy_run(src: Path, dest: Path) -> Path:
    """A fixture run directory copied as a user would after moving it (exports only, no
    .nsys-rep), its gzipped exports unpacked in place: the input of `orch collect RUN`."""
    shutil.copytree(src, dest)
    for gz in (dest / "exports").glob("*.sqlite.gz"):
        with gzip.open(gz, "rb") as fi, open(gz.with_suffix(""), "wb") as fo:
            shutil.copyfileobj(fi, fo)
        gz.unlink()
    return dest


def run_orch(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
             timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The real CLI in a subprocess, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=timeout, env={**os.environ, **(env or {})},
                          check=False)


def processes() -> str:
    """The job-related processes now (pid, parent, state, elapsed, kernel wait channel, command): the
    evidence a test whose job did not end shows, to tell a hung program from a hung nsys."""
    p = subprocess.run(["ps", "-eo", "pid,ppid,stat,etime,wchan:24,args"], capture_output=True, text=True, check=False)
    keep = ("nsys", "python", "torchrun", "QdstrmImporter", "bash", "sh -c")
    return "\nprocesses:\n" + "\n".join(ln[:240] for ln in p.stdout.splitlines() if any(k in ln for k in keep))


class JobTree:
    """Runs orch commands under the test's subreaper (tests/subreaper.py)."""

    def __init__(self) -> None:
        self.p = subprocess.Popen([sys.executable, str(REPO / "tests" / "subreaper.py")], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, cwd=REPO)

    def _ask(self, req: dict) -> dict:
        self.p.stdin.write(json.dumps(req) + "\n")
        self.p.stdin.flush()
        return json.loads(self.p.stdout.readline())

    def orch(self, *args: str, timeout: float = 300, env: dict[str, str] | None = None
             ) -> subprocess.CompletedProcess[str]:
        r = self._ask({"run": [sys.executable, "-m", "orchestrator.cli", *args], "timeout": timeout,
                       "env": env or {}})
        return subprocess.CompletedProcess(args, r["rc"], r["stdout"], r["stderr"])

    def survivors(self, settle_s: float = 10) -> list[list]:
        """What is still running after up to `settle_s` (the controller exits just after its task)."""
        deadline = time.monotonic() + settle_s
        while True:
            left = self._ask({"survivors": True})["pids"]
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)

    def close(self) -> None:
        self._ask({"kill": True})
        self.p.stdin.close()
        self.p.wait(timeout=30)


@pytest.fixture
def tree():
    t = JobTree()
    yield t
    t.close()


class Cluster:
    def __init__(self, root: Path, port_base: int, accounting: bool) -> None:
        self.dir = root
        self.env = {"ORCH_SLURM_DIR": str(root), "ORCH_SLURM_PORT_BASE": str(port_base)}
        self.accounting = accounting

    @property
    def client_env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.dir / "etc" / "slurm.conf")}

    def script(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(REPO / "scripts" / "local_slurm.sh"), *args], text=True,
                              capture_output=True, timeout=180, env={**os.environ, **self.env}, check=False)


def _start_cluster(root: Path, port_base: int, accounting: bool) -> Cluster:
    need(os.geteuid() == 0, "the local Slurm cluster needs root")
    need(shutil.which("slurmctld") is not None and shutil.which("munged") is not None,
         "slurm-wlm/munge not installed (scripts/install_system_deps.sh)")
    c = Cluster(root, port_base, accounting)
    p = c.script("start", *([] if accounting else ["--no-accounting"]))
    if p.returncode != 0:
        logs = "".join(f"\n--- {f.name}:\n" + f.read_text(errors="replace")[-1500:]
                       for f in sorted((root / "log").glob("*")) if f.is_file())  # before stop removes them
        c.script("stop")
        pytest.fail(f"local Slurm did not start:\n{p.stderr[-3000:]}{logs}\n{processes()}")
    return c


@pytest.fixture(scope="session")
def slurm_cluster():
    """A real 2-node Slurm (slurmctld + slurmdbd/MariaDB accounting + node1, node2)."""
    c = _start_cluster(Path(f"/tmp/orch-slurm-test-{os.getpid()}"), 17100, accounting=True)
    yield c
    c.script("stop")


@pytest.fixture
def slurm_cluster_disposable():
    """A cluster of its own for tests that break nodes."""
    c = _start_cluster(Path(f"/tmp/orch-slurm-kill-{os.getpid()}"), 17300, accounting=True)
    yield c
    c.script("stop")


@pytest.fixture(scope="session")
def slurm_cluster_noacct():
    """The same cluster without accounting: sacct fails, orch must fall back."""
    c = _start_cluster(Path(f"/tmp/orch-slurm-noacct-{os.getpid()}"), 17200, accounting=False)
    yield c
    c.script("stop")


# Every test declares exactly one lane, as a rule through its module's `pytestmark` (a module
# whose tests differ marks each test instead); pyproject.toml lists the markers, README "Set up
# and test" says how to run each:
#   fast    small tables, one real export or the spec alone: seconds, the feedback while editing
#   replay  collect and analysis of the shipped exports (tests/fixtures), no job
#   jobs    real nsys captures, torchrun jobs, Slurm or a browser: mostly waiting on them
# plus `slurm`, `nsys`, `browser` where a test needs that component. A test without its lane
# fails collection: a lane is a choice about a new test's cost, never a default.
LANES = ("fast", "replay", "jobs")


def _lanes(item: pytest.Item) -> set[str]:
    return {m.name for m in item.iter_markers() if m.name in LANES}


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A module (or class) with a test of no lane, or of two, fails to collect, naming the tests
    and the fix; in each pytest-xdist worker too."""
    report = yield
    wrong = [f"{x.name}: {', '.join(sorted(_lanes(x))) or 'no lane'}" for x in report.result or []
             if isinstance(x, pytest.Function) and len(_lanes(x)) != 1]
    if report.passed and wrong:
        report.outcome = "failed"
        report.longrepr = (f"{len(wrong)} test(s) without exactly one lane ({'; '.join(wrong[:5])}): give the "
                           "module `pytestmark = pytest.mark.fast` (or `replay`, `jobs`), or each test one of "
                           "those marks (tests/conftest.py LANES says which is which)")
        report.result = []
    return report


JOB_GROUPS = ("jobs", "slurm")  # the first groups handed out, the longest first


def _group(item: pytest.Item, lane: str) -> str:
    """The tests that must share a pytest-xdist worker: every Slurm test, one after the other (the
    clusters' fixed ports and the session's clusters); every other job, one after the other; and
    each other module whole (its module-scoped stores are built once). The two job groups are the
    longest chains, so they start first, one on each worker, and the other groups fill in beside
    and after them. A job test holds what it times to what orch guarantees on a busy machine, so
    a job beside another job, or beside an analysis, passes as one alone."""
    if item.get_closest_marker("slurm"):
        return JOB_GROUPS[1]
    if lane == "jobs":
        return JOB_GROUPS[0]
    return item.path.stem


def _groups_dir(controller_pid: int) -> Path:
    """Where each pytest-xdist worker writes its tests' groups for the controller's scheduler."""
    return Path(tempfile.gettempdir()) / f"orch-xdist-groups-{controller_pid}"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Writes each test's lane in its report (the lane times below, the JUnit XML); in a
    pytest-xdist worker, also each test's group (`_group`) to a file the controller's
    scheduler reads (`pytest_xdist_make_scheduler`). The groups travel by file, not by
    xdist_group marks: pytest-xdist 3.8 renames node ids to carry them, which pytest 9.2 no
    longer reads (pytest-xdist issue 1386), and the tests would run ungrouped without a word."""
    groups = {}
    for item in items:
        (name,) = _lanes(item)
        item.user_properties.append(("lane", name))
        groups[item.nodeid] = _group(item, name)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:  # the controller is the worker's parent (execnet's popen gateway)
        d = _groups_dir(os.getppid())
        d.mkdir(exist_ok=True)
        (d / f"{worker}.json").write_text(json.dumps(groups))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under `pytest -n N`: whole groups (`_group`) to each worker, as `--dist loadscope` hands out
    modules. Other `--dist` modes are pytest-xdist's."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    # The job groups first, then the others by their number of tests, the largest first (the
    # longest chains start first, the rest fills in beside them). Only the groups are reordered:
    # a worker runs the tests of the indexes it is sent in its own collection, which must keep
    # its order.
    config.option.loadscopereorder = True

    class Grouped(LoadScopeScheduling):
        _groups: dict[str, str] | None = None

        def _assign_work_unit(self, node) -> None:
            for first in reversed(JOB_GROUPS):
                if first in self.workqueue:
                    self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                d = _groups_dir(os.getpid())
                self._groups = {k: v for f in sorted(d.glob("*.json")) for k, v in json.loads(f.read_text()).items()}
                shutil.rmtree(d, ignore_errors=True)
                if not self._groups:
                    raise RuntimeError(f"no test groups from the workers in {d}: tests/conftest.py writes them")
            return self._groups[nodeid]

    return Grouped(config, log)


# Each lane's share of the run: the summed durations (setup, call, teardown) of its tests. Under
# pytest-xdist the lanes overlap, so their sum exceeds the run's wall time. Beside it, the CPU
# each phase spent in the worker and in the processes it waited for (orch's CLI, the jobs'
# launchers and ranks; not daemons such as a session's Slurm cluster): on 2 cores the suite is
# CPU-bound, so CPU, not wall time, says what a change to a test saves.
_lane_tests: Counter[str] = Counter()
_lane_s: Counter[str] = Counter()
_lane_cpu: Counter[str] = Counter()
_module_cpu: Counter[str] = Counter()
_cpu_mark: dict[str, float] = {}


def _cpu_s() -> float:
    """CPU seconds, user and system, of this process and of its waited-for children."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _cpu_mark[nodeid] = _cpu_s()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Each phase's report carries the CPU since the previous phase ended (`cpu_s`)."""
    report = yield
    now = _cpu_s()
    report.user_properties.append(("cpu_s", round(now - _cpu_mark.get(item.nodeid, now), 3)))
    _cpu_mark[item.nodeid] = now
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    props = dict(report.user_properties)
    name = props.get("lane", "?")
    _lane_tests[name] += report.when == "setup"
    _lane_s[name] += report.duration
    _lane_cpu[name] += props.get("cpu_s", 0.0)
    _module_cpu[report.nodeid.split("::")[0]] += props.get("cpu_s", 0.0)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _lane_s:
        terminalreporter.write_sep("=", "lane times (summed test durations and CPU)")
        for name, seconds in _lane_s.most_common():
            terminalreporter.write_line(f"{name:<7} {_lane_tests[name]:>4} tests {seconds:8.1f} s "
                                        f"{_lane_cpu[name]:8.1f} CPU s")
        terminalreporter.write_sep("=", "the modules that spent most CPU")
        for module, cpu in _module_cpu.most_common(15):
            terminalreporter.write_line(f"{cpu:8.1f} CPU s  {module}")
