"""What `pip install orch` installs: the wheel built from this tree holds every module, SQL
file, template and page asset the editable checkout runs from. pyproject.toml lists orch's
packages by name, so a new package folder missing from that list works in the tests (editable)
and is absent for every user who installs orch from a wheel or with `pip install --target`."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parents[1]


def _expected() -> set[str]:
    """Every file the package must carry, named as installed (templates/ and cluster_configs/
    are installed inside the package, as pyproject's package-dir maps them)."""
    want = {p.relative_to(REPO).as_posix() for pat in ("*.py", "*.sql", "*.html", "*.js")
            for p in (REPO / "orchestrator").rglob(pat) if "__pycache__" not in p.parts}
    want |= {f"orchestrator/templates/{p.name}" for p in (REPO / "templates").glob("*.j2")}
    want |= {f"orchestrator/cluster_configs/{p.name}" for p in (REPO / "cluster_configs").glob("*.yaml")}
    return want


def test_the_wheel_holds_every_module_and_data_file(tmp_path: Path) -> None:
    src = tmp_path / "src"  # a clean copy: a stale build/ in the checkout could hide a missing package
    for name in ("orchestrator", "templates", "cluster_configs"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(tmp_path / "dist"), str(src)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    (wheel,) = (tmp_path / "dist").glob("orch-*.whl")
    have = set(zipfile.ZipFile(wheel).namelist())
    assert not _expected() - have, f"missing from the wheel (pyproject.toml packages): {sorted(_expected() - have)}"
