"""The shipped captures as orch makes them, once per test session, for every module that reads
them: the H200 exports decompressed once, collected once in process, and each scoreboard case
(tests/fixtures/truth: every real run and export set) collected and reported once through the
CLI, as `scripts/scoreboard.py` makes it. Under pytest-xdist the workers share the entries: the
first to ask makes one under a lock file, the others wait for it and read it.

Entries are read-only by contract: a test that changes files copies them first. Tests run as
root, whom file modes do not stop, so each entry's files are fingerprinted (size, mtime) when
made and checked again when the session ends; a changed entry fails the run, naming the files.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import fcntl
import functools
import gzip
import importlib.util
import json
import lzma
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"
TRUTH = FIXTURES / "truth"
_DONE = ".made"  # an entry's fingerprint, written last: its presence says the entry is whole


def loop_export(stem: str, dest: Path) -> Path:
    """tests/fixtures/loops' export of the loop `stem` decompressed into `dest` (xz, which orch
    does not read itself), under its own name less `.xz`."""
    (src,) = (FIXTURES / "loops").glob(f"{stem}_r0_*.sqlite.xz")
    out = dest / src.name.removesuffix(".xz")
    with lzma.open(src, "rb") as fi, open(out, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    return out


@functools.cache
def scoreboard() -> ModuleType:
    """scripts/scoreboard.py as a module (a script, not a package)."""
    spec = importlib.util.spec_from_file_location("orch_scoreboard", REPO / "scripts" / "scoreboard.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


def _fingerprint(d: Path) -> dict[str, list[int]]:
    return {str(p.relative_to(d)): [p.stat().st_size, p.stat().st_mtime_ns]
            for p in sorted(d.rglob("*")) if p.is_file() and p.name != _DONE}


class Stores:
    """The session's entries under `root` (shared by the xdist workers of one run)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.used: set[Path] = set()

    @contextlib.contextmanager
    def _locked(self, d: Path, wait: bool = True) -> Iterator[bool]:
        d.parent.mkdir(parents=True, exist_ok=True)
        with open(d.with_name(d.name + ".lock"), "w") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True

    def entry(self, kind: str, key: str, make: Callable[[Path], None], wait: bool = True) -> Path | None:
        """The entry `kind/key`, made by `make(folder)` if no process made it yet; None when
        `wait` is off and another process is making it now."""
        d = self.root / kind / key
        with self._locked(d, wait) as got:
            if not got:
                return None
            if not (d / _DONE).is_file():
                shutil.rmtree(d, ignore_errors=True)
                d.mkdir(parents=True)
                make(d)
                (d / _DONE).write_text(json.dumps(_fingerprint(d)))
        self.used.add(d)
        return d

    def h200(self) -> Path:
        """tests/fixtures/h200's exports decompressed, a folder a capture: <entry>/<case>/<file>.sqlite."""
        def make(d: Path) -> None:
            for gz in sorted((FIXTURES / "h200").glob("*/*.sqlite.gz")):
                (d / gz.parent.name).mkdir(exist_ok=True)
                with gzip.open(gz, "rb") as fi, open(d / gz.parent.name / gz.name.removesuffix(".gz"), "wb") as fo:
                    shutil.copyfileobj(fi, fo)
        out = self.entry("exports", "h200", make)
        assert out is not None
        return out

    def store(self, exports: Path, layout: str = "") -> Path:
        """The store of the exports in `exports` (a folder of this session's entries), collected
        in process (`collect`, with `layout` as `--layout` takes it): its profile.duckdb."""
        from rich.console import Console

        from orchestrator.collect.collect import collect
        from orchestrator.layout import Layout

        key = f"{exports.relative_to(self.root)}+{layout}".replace("/", "+")
        quiet = Console(stderr=True, quiet=True)
        d = self.entry("store", key, lambda d: collect([exports], d / "run", layout=Layout.parse(layout) if layout
                                                       else Layout(), console=quiet))
        assert d is not None
        return d / "run" / "profile.duckdb"

    def case(self, name: str, wait: bool = True) -> Path | None:
        """A scoreboard case as scripts/scoreboard.py makes it: `orch collect` and `orch report
        --json --wide` over its run or exports; the folder holds run/, report.json and
        report.txt (the terminal's text), or error.txt when orch failed."""
        truth = json.loads((TRUTH / f"{name}.json").read_text())

        def make(d: Path) -> None:
            try:
                scoreboard().report_of(truth, d)
            except RuntimeError as e:
                (d / "error.txt").write_text(str(e))
        return self.entry("case", name, make, wait)

    def report(self, name: str) -> tuple[Path, dict, str]:
        """(run directory, report JSON, terminal text) of a scoreboard case; orch must not fail."""
        d = self.case(name)
        assert d is not None
        assert not (d / "error.txt").exists(), (d / "error.txt").read_text()
        return d / "run", json.loads((d / "report.json").read_text()), (d / "report.txt").read_text()

    def cases(self, names: list[str]) -> Path:
        """Every named case made (on all cores; the cases another worker is making now are
        waited for last); returns the folder that holds them, one folder a case."""
        with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            made = pool.map(lambda n: self.case(n, wait=False), names)
            busy = [n for n, d in zip(names, made, strict=True) if d is None]
            list(pool.map(self.case, busy))
        return self.root / "case"

    def changed(self) -> list[str]:
        """Files of the entries this process used that changed since they were made."""
        out = []
        for d in sorted(self.used):
            made = json.loads((d / _DONE).read_text())
            now = _fingerprint(d)
            out += [f"{d.relative_to(self.root)}/{f}" for f in sorted(set(made) | set(now))
                    if made.get(f) != now.get(f)]
        return out


@pytest.fixture(scope="session")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stores]:
    """The session's shared entries (module docstring). Under xdist every worker's base temp is
    a folder of the run's own, whose parent the workers share."""
    base = tmp_path_factory.getbasetemp()
    s = Stores((base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "stores")
    yield s
    changed = s.changed()
    if changed:
        pytest.fail(f"tests changed the shared stores (tests/stores.py: copy an entry before changing it): "
                    f"{changed[:10]}")
