"""Per-phase wall-clock timers for `--timings` (collect, analyze, report).

Speed work starts from where the time goes, on the user's own data, not from a guess: every
phase of a collect (export, probe, ingest per table, finalize, checkpoint) and of an analysis
(each SQL file, the report) is wrapped in `phase(name)`. Off by default: a disabled timer is
one attribute check, so it can stay in hot loops. Times from worker threads add up (a phase
run by two workers shows the summed thread time, so the total can exceed the wall time).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


class Timings:
    """Accumulated seconds and counts per phase name, in first-seen order."""

    def __init__(self) -> None:
        self.enabled = False
        self.started = time.perf_counter()
        self._lock = threading.Lock()
        self._s: dict[str, float] = {}
        self._n: dict[str, int] = {}

    def reset(self, enabled: bool) -> None:
        with self._lock:
            self.enabled, self.started = enabled, time.perf_counter()
            self._s.clear()
            self._n.clear()

    def add(self, name: str, seconds: float) -> None:
        with self._lock:
            self._s[name] = self._s.get(name, 0.0) + seconds
            self._n[name] = self._n.get(name, 0) + 1

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        t = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - t)

    def rows(self) -> list[tuple[str, float, int]]:
        with self._lock:
            return [(k, v, self._n[k]) for k, v in self._s.items()]

    def lines(self) -> list[str]:
        """Human-readable table: phase, seconds, calls; then the wall time since reset."""
        out = [f"{name:<40} {s:8.3f} s  x{n}" for name, s, n in self.rows()]
        out.append(f"{'wall (since start)':<40} {time.perf_counter() - self.started:8.3f} s")
        return out


TIMINGS = Timings()
phase = TIMINGS.phase
