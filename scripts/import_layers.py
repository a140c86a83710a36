"""Check that orch's imports run one way: each module imports only modules of its own layer or
of a lower one, where the layers are the pipeline's stages (spec, render, submit, collect,
analyze, report) with what several of them read below them (LAYERS). An import inside a function
counts as one at the top: it is the same dependency, only later.

    python scripts/import_layers.py        # one line per import that runs back; exit 1 if any
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "orchestrator"

# Lowest first. A name is a top-level module or subpackage of orchestrator/.
LAYERS: list[tuple[str, ...]] = [
    ("errors", "numbers", "fsutil", "runpaths", "progress", "ranklist", "naming", "sqltext", "sqlmodules",
     "duckdb_memory", "timings", "layout", "limits"),
    ("store", "nsys"),
    ("metrics",),
    ("spec",),
    ("render",),
    ("rundir", "submit"),
    ("collect",),
    ("analyze",),
    ("export", "api"),
    ("report",),
    # `orch sweep` runs the whole pipeline once per point, as the command line does.
    ("sweep", "cli"),
]
# Imports that run back on purpose, each with why.
ALLOWED = {
    # `orchestrator.analyze(...)` is the Python API's entry point: the package is callable.
    ("orchestrator.analyze", "orchestrator.api"),
    # The package's lazy attributes (`orchestrator.analyze`, `orchestrator.Store`) are the API.
    ("orchestrator", "orchestrator.api"),
}


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) < 2:
        return None
    for i, names in enumerate(LAYERS):
        if parts[1] in names:
            return i
    return None


def _is_module(root: Path, name: str) -> bool:
    """Whether the dotted `name` is a module or package under `root` (not an attribute of one,
    such as `orchestrator.__version__`)."""
    path = root.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def module_of(path: Path, root: Path) -> str:
    """The dotted name of the module at `path` under `root` (a package: its own name)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, package: Path = PACKAGE) -> list[tuple[str, int]]:
    """(imported orchestrator module, line) of every import in the file, at any depth, relative
    ones resolved: `from X import name` imports the module X.name where that is one, else X; an
    attribute of the package itself (`from orchestrator import __version__`) imports no module."""
    root = package.parent
    me = module_of(path, root)
    here = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        found: list[str] = []
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names if a.name.startswith("orchestrator.")]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], base]).strip(".")
            if base == "orchestrator" or base.startswith("orchestrator."):
                found = [f"{base}.{a.name}" if _is_module(root, f"{base}.{a.name}") else base for a in node.names]
                found = [t for t in found if t != "orchestrator"]
        out += [(t, node.lineno) for t in dict.fromkeys(found)]
    return out


def back_imports(package: Path = PACKAGE) -> list[str]:
    """One line per import of `package` (the orchestrator/ folder of a checkout) from a module
    into a later layer, or of or by a module in no layer."""
    found = []
    root = package.parent
    for path in sorted(package.rglob("*.py")):
        module = module_of(path, root)
        where = f"{path.relative_to(root)}"
        mine = layer_of(module)
        if mine is None and module != "orchestrator":
            found.append(f"{where}: {module} is in no layer (add it to LAYERS)")
            continue
        for target, line in imports(path, package):
            if module.split(".")[:2] == target.split(".")[:2] or (module, target) in ALLOWED:
                continue
            theirs = layer_of(target)
            if theirs is None:
                found.append(f"{where}:{line}: {target} is in no layer (add it to LAYERS)")
            elif mine is not None and theirs > mine:
                found.append(f"{where}:{line}: {module} imports {target}, a later layer")
    return found


def main() -> int:
    found = back_imports()
    for f in found:
        print(f)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
