"""A Ctrl-C that something swallowed still stops the collect before its store is published."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SNIPPET = """
import os, signal, sys
from pathlib import Path
from orchestrator import interrupt
from orchestrator.collect.ingest import new_store
interrupt.install()
try:
    os.kill(os.getpid(), signal.SIGINT)
except KeyboardInterrupt:
    pass  # what a query error handler did with it
store = Path(sys.argv[1])
try:
    with new_store(store) as tmp:
        tmp.write_text("half")
except KeyboardInterrupt:
    print("interrupted", store.exists(), sorted(p.name for p in store.parent.iterdir()))
"""


def test_swallowed_interrupt_publishes_nothing(tmp_path: Path) -> None:
    store = tmp_path / "profile.duckdb"
    p = subprocess.run([sys.executable, "-c", SNIPPET, str(store)], capture_output=True, text=True, timeout=60,
                       check=False)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "interrupted False []"  # no store, no temp file left
