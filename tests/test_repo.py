"""The repository stands on its own: nothing reads a folder beside the checkout, and the
package's modules import each other without circles (an abstraction never imports its
implementations), each stage only earlier ones and what lies below them
(scripts/import_layers.py)."""

from __future__ import annotations

import functools
import importlib.util
import re
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.fast

# Built from parts so that this file does not name the folder it looks for.
BESIDE = re.compile(re.escape("..") + r"[/\\]" + "shared" + r"\b")


def test_nothing_names_a_folder_beside_the_checkout() -> None:
    named = []
    for top in ("tests", "scripts", "docs"):
        for f in sorted((REPO / top).rglob("*")):
            if f.is_file() and f.suffix in {".py", ".sh", ".md", ".txt", ".yaml", ".json", ".j2", ".toml"}:
                named += [f"{f.relative_to(REPO)}:{i}" for i, line in enumerate(f.read_text(errors="replace")
                                                                             .splitlines(), 1) if BESIDE.search(line)]
    named += [f"README.md:{i}" for i, line in enumerate((REPO / "README.md").read_text().splitlines(), 1)
              if BESIDE.search(line)]
    assert not named, f"these lines read a folder a clone does not have; copy what they need into the repo: {named}"


def import_graph() -> dict[str, set[str]]:
    """Every import between the package's modules, wherever it stands (a function's import and
    one under TYPE_CHECKING count: each is a dependency a reader has to follow). An import of
    an enclosing package (`from orchestrator import numbers` names the module; `__version__`
    the package) is no edge: Python loads a package before any module inside it."""
    layers = _layers()  # scripts/import_layers.py: the one reader of the package's imports
    files = {layers.module_of(f, REPO): f for f in (REPO / "orchestrator").rglob("*.py")}
    return {mod: {t for t, _ in layers.imports(f) if t in files and t != mod and not mod.startswith(t + ".")}
            for mod, f in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_checker_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles() -> None:
    graph = import_graph()
    assert graph["orchestrator.submit.core"] >= {"orchestrator.submit.local", "orchestrator.submit.slurm"}
    found = cycles(graph)
    assert not found, f"modules that import each other (directly or around a circle): {found}"


@functools.cache
def _layers() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_layers", REPO / "scripts" / "import_layers.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def test_imports_run_one_way_through_the_layers() -> None:
    assert _layers().back_imports() == []


def test_the_layer_checker_finds_an_import_that_runs_back(tmp_path: Path) -> None:
    """A copy of the package with the store importing collect (a later layer), a lazy import of
    the analysis in the spec, and a new top-level module no layer names."""
    pkg = tmp_path / "orchestrator"
    shutil.copytree(REPO / "orchestrator", pkg, ignore=shutil.ignore_patterns("__pycache__", "*.sql"))
    tables = pkg / "store" / "tables.py"
    n = len(tables.read_text().splitlines())
    tables.write_text(tables.read_text() + "from orchestrator.collect.gather import discover  # noqa\n")
    ranks = pkg / "spec" / "ranks.py"
    m = len(ranks.read_text().splitlines())
    ranks.write_text(ranks.read_text() + "\n\ndef f() -> None:\n    from orchestrator import analyze  # noqa\n")
    (pkg / "extra.py").write_text("X = 1\n")
    assert sorted(_layers().back_imports(pkg)) == [
        "orchestrator/extra.py: orchestrator.extra is in no layer (add it to LAYERS)",
        f"orchestrator/spec/ranks.py:{m + 4}: orchestrator.spec.ranks imports orchestrator.analyze, a later layer",
        f"orchestrator/store/tables.py:{n + 1}: orchestrator.store.tables imports orchestrator.collect.gather, "
        "a later layer",
    ]
