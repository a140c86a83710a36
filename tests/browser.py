"""Headless Chromium as a person's browser: the DOM after rendering, and screenshots."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.conftest import need

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    need(path is not None, "chromium not installed (scripts/install_system_deps.sh)")
    return path  # type: ignore[return-value]


def dump_dom(html: Path, profile: Path) -> str:
    p = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", "--dump-dom", html.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "</html>" in p.stdout, p.stderr[-2000:]
    return p.stdout


def screenshot(html: Path, png: Path, profile: Path, size: str = "1250,2400") -> Path:
    subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}",
                    f"--window-size={size}", html.as_uri()], capture_output=True, timeout=120)
    assert png.exists() and png.stat().st_size > 10_000, f"no screenshot of {html}"
    return png
