"""Run a command the way a person does: in a pseudo-terminal of a given size, read back as the
screen they would see.

The child gets a real pty as its controlling terminal (its own session, stdin/stdout/stderr on
the pty's slave side), so `isatty()`, rich's live displays, the terminal's width and Ctrl-C
(the line discipline turns a typed ^C into SIGINT for the foreground process group) behave as
at a keyboard. Everything the child writes is kept as raw bytes and also fed to `pyte`, a VT100
emulator, so a test can assert on what is left on the screen after cursor moves and erases
(a transient progress bar is written, then cleared).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyte

ROWS = 200  # tall enough that nothing the command prints scrolls off the emulated screen
# The emulated screen is this much wider than the terminal the command is told about, so a line
# the command writes past the terminal's width stays one line on it (a real terminal would wrap
# it, hiding the overflow) and `lines()` shows its true length.
OVERHANG = 200


class Terminal:
    """One command in a pseudo-terminal `cols` wide."""

    def __init__(self, argv: Sequence[str], *, cols: int = 80, env: Mapping[str, str] | None = None,
                 cwd: str | Path | None = None) -> None:
        self.cols = cols
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, cols, 0, 0))
        full_env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": str(cols), "LINES": str(ROWS)}
        for k in ("NO_COLOR", "FORCE_COLOR", "CI"):  # a person's terminal, not CI's log
            full_env.pop(k, None)
        full_env.update(env or {})
        self.proc = subprocess.Popen(list(argv), stdin=slave, stdout=slave, stderr=slave, cwd=cwd, env=full_env,
                                     start_new_session=True, preexec_fn=_take_terminal, close_fds=True)
        os.close(slave)
        self._master = master
        self.raw = b""
        self._screen = pyte.Screen(cols + OVERHANG, ROWS)
        self._stream = pyte.ByteStream(self._screen)

    def _pump(self, timeout: float) -> bool:
        """Read what is there within `timeout`; False once the child closed the terminal."""
        ready, _, _ = select.select([self._master], [], [], timeout)
        if not ready:
            return True
        try:
            chunk = os.read(self._master, 65536)
        except OSError:  # EIO: every holder of the slave side has closed it
            return False
        if not chunk:
            return False
        self.raw += chunk
        self._stream.feed(chunk)
        return True

    def expect(self, text: str, timeout: float = 60) -> None:
        """Read until `text` has been written (raw output, escapes and all, decoded)."""
        deadline = time.monotonic() + timeout
        while text not in self.text:
            if time.monotonic() > deadline:
                raise AssertionError(f"{text!r} not written within {timeout} s; the screen:\n{self.screen()}")
            if not self._pump(0.1) and self.proc.poll() is not None:
                raise AssertionError(f"the command ended (rc {self.proc.returncode}) without writing {text!r}; "
                                     f"the screen:\n{self.screen()}")

    def type(self, keys: bytes) -> None:
        """Type `keys`; b"\\x03" is Ctrl-C."""
        os.write(self._master, keys)

    def wait(self, timeout: float = 300) -> int:
        """Read until the command exits and nothing holds the terminal open; its exit status."""
        deadline = time.monotonic() + timeout
        while True:
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"still running after {timeout} s; the screen:\n{self.screen()}")
            if not self._pump(0.1) and self.proc.poll() is not None:
                break
            if self.proc.poll() is not None and not self._drain_ready():
                break
        os.close(self._master)
        return self.proc.wait()

    def _drain_ready(self) -> bool:
        """After the command exited: read what is still buffered; True while more may come."""
        ready, _, _ = select.select([self._master], [], [], 0.2)
        return bool(ready) and self._pump(0)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    @property
    def text(self) -> str:
        return self.raw.decode(errors="replace")

    def screen(self) -> str:
        """What the terminal shows now: its lines, trailing blanks stripped, empty tail dropped."""
        lines = [ln.rstrip() for ln in self._screen.display]
        while lines and not lines[-1]:
            lines.pop()
        return "\n".join(lines)

    def lines(self) -> list[str]:
        return self.screen().splitlines()


def _take_terminal() -> None:
    """In the child, after setsid: make the pty its controlling terminal (^C then signals it)."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def run(argv: Sequence[str], *, cols: int = 80, env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None, timeout: float = 300) -> tuple[int, Terminal]:
    """Run `argv` to its end in a terminal; its exit status and the terminal (raw bytes, screen)."""
    t = Terminal(argv, cols=cols, env=env, cwd=cwd)
    return t.wait(timeout), t
