"""Every subcommand that needs no job, typed as a person types it: in a pseudo-terminal 80 and
160 columns wide, with and without NO_COLOR, and with its output to a pipe and to a file.

What a person sees is checked on the screen a VT100 emulator draws from the bytes the command
wrote (tests/terminal.py): the exit status, no traceback, nothing past the terminal's width,
no colour under NO_COLOR, and where the command shows progress (collect's exports and maps, the
analysis) that the display was drawn and then cleared. Through a pipe or into a file the
output carries no escape code at all. The commands that need a job (submit, status, cancel,
sweep) are in tests/test_interrupt.py and tests/test_e2e.py.
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, REPO
from tests.terminal import run

ORCH = [sys.executable, "-m", "orchestrator.cli"]
GPU_E2E = REPO / "tests" / "fixtures" / "gpu_e2e"
CSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
COLOUR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-9]|4[0-9]|9[0-7]|10[0-7])(?:;[0-9;]*)?m")
# A line of rich's progress display ends with the parts done of all, then the time elapsed.
PROGRESS_LINE = re.compile(r"\d+/(?:\d+|\?)\s+\d+:\d\d:\d\d\s*$", re.M)


@dataclass(frozen=True)
class Case:
    """One subcommand: its arguments (from the inputs and a fresh folder of its own), the exit
    status it must end with, and the words its progress display shows (None: it has none)."""

    argv: Callable[[Path, Path], list[str]]
    rc: int = 0
    progress: str | None = None


def _exports(inputs: Path) -> list[str]:
    return [str(p) for p in sorted(inputs.glob("ddp_r*.sqlite"))]


CASES: dict[str, Case] = {
    "validate": Case(lambda i, o: ["validate", str(EXAMPLES / "local-cpu.yaml")]),
    "render": Case(lambda i, o: ["render", str(EXAMPLES / "local-cpu.yaml"), "-o", str(o / "rendered")]),
    "collect": Case(lambda i, o: ["collect", "--from", *_exports(i), "--out", str(o / "store")],
                    progress="export"),
    "redact": Case(lambda i, o: ["redact", *_exports(i), "-o", str(o / "redacted")]),
    "report": Case(lambda i, o: ["report", str(i / "store")], progress="analysis"),
    "report-files": Case(lambda i, o: ["report", str(i / "store"), "--html", str(o / "r.html"),
                                       "--json", str(o / "r.json")], progress="HTML report"),
    "analyze": Case(lambda i, o: ["analyze", *_exports(i), "--out", str(o / "analyzed")], progress="analysis"),
    "diff": Case(lambda i, o: ["diff", str(i / "store"), str(i / "store")]),
    "export-trace": Case(lambda i, o: ["export-trace", str(i / "store"), "-o", str(o / "all.pftrace")]),
}
# (columns, NO_COLOR). Each run starts orch and most analyse a store (about a second of CPU), so
# the fast lane takes the terminal people hit first (80 columns, colour); the replay lane the rest.
TERMINALS = [pytest.param(c, n, id=f"{c}cols{'-nocolor' if n else ''}",
                          marks=pytest.mark.fast if (c, n) == (80, False) else pytest.mark.replay)
             for c, n in ((80, False), (80, True), (160, False), (160, True))]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two real GPU ranks (tests/fixtures/gpu_e2e) and one store collected from them."""
    out = tmp_path_factory.mktemp("terminal-inputs")
    for gz in sorted(GPU_E2E.glob("ddp_r*.sqlite.gz")):
        with gzip.open(gz, "rb") as fi, open(out / gz.name.removesuffix(".gz"), "wb") as fo:
            shutil.copyfileobj(fi, fo)
    subprocess.run([*ORCH, "collect", "--from", *_exports(out), "--out", str(out / "store")],
                   check=True, capture_output=True, timeout=300)
    return out


def _plain(raw: bytes) -> str:
    """The text the command wrote, its escape sequences removed."""
    return CSI.sub(b"", raw).decode(errors="replace")


def _no_crash(text: str) -> None:
    assert "Traceback" not in text and "object type name" not in text and "lost sys.stderr" not in text, text


@pytest.mark.parametrize(("cols", "no_color"), TERMINALS)
@pytest.mark.parametrize("name", list(CASES))
def test_in_a_terminal(name: str, cols: int, no_color: bool, inputs: Path, tmp_path: Path) -> None:
    case = CASES[name]
    rc, term = run([*ORCH, *case.argv(inputs, tmp_path)], cols=cols, env={"NO_COLOR": "1"} if no_color else None,
                   cwd=tmp_path, timeout=300)
    screen = term.screen()
    assert rc == case.rc, f"exit {rc}; the screen:\n{screen}"
    _no_crash(term.text)
    wide = [ln for ln in term.lines() if len(ln) > cols]
    assert not wide, f"{len(wide)} line(s) past the terminal's {cols} columns, e.g.\n{wide[0]}"
    if no_color:
        assert not COLOUR.search(term.text), f"colour under NO_COLOR: {COLOUR.search(term.text)}"
    if case.progress:
        drawn = [ln for ln in _plain(term.raw).split("\r") if case.progress in ln and PROGRESS_LINE.search(ln)]
        assert drawn, f"no progress display ({case.progress!r}) was drawn; the screen:\n{screen}"
        left = [ln for ln in term.lines() if PROGRESS_LINE.search(ln)]
        assert not left, f"the progress display was left on the screen: {left}"


@pytest.mark.replay
@pytest.mark.parametrize("to", ["pipe", "file"])
@pytest.mark.parametrize("name", list(CASES))
def test_to_a_pipe_or_a_file(name: str, to: str, inputs: Path, tmp_path: Path) -> None:
    case = CASES[name]
    argv = [*ORCH, *case.argv(inputs, tmp_path)]
    if to == "pipe":
        p = subprocess.run(argv, capture_output=True, cwd=tmp_path, timeout=300)
        rc, out, err = p.returncode, p.stdout, p.stderr
    else:
        with open(tmp_path / "out.txt", "wb") as fo, open(tmp_path / "err.txt", "wb") as fe:
            rc = subprocess.run(argv, stdout=fo, stderr=fe, cwd=tmp_path, timeout=300).returncode
        out, err = (tmp_path / "out.txt").read_bytes(), (tmp_path / "err.txt").read_bytes()
    assert rc == case.rc, err.decode(errors="replace")
    _no_crash((out + err).decode(errors="replace"))
    for stream in (out, err):
        assert not CSI.search(stream) and b"\x1b" not in stream, f"escape codes in a {to}: {stream[:300]!r}"
        assert not PROGRESS_LINE.search(stream.decode(errors="replace")), f"a progress display in a {to}"


@pytest.mark.jobs
@pytest.mark.nsys
def test_the_job_commands_in_a_terminal(tmp_path: Path) -> None:
    """submit --wait, status, cancel and sweep of a real (short) local job, in a terminal: what a
    person sees fits the terminal and ends without a traceback; status in every terminal and
    through a pipe."""
    spec = tmp_path / "job.yaml"
    spec.write_text((EXAMPLES / "local-cpu.yaml").read_text().replace('[--steps, "6"', '[--steps, "3"')
                    .replace("name: ddp-cpu", "name: terminal")
                    .replace("script: train.py", f"script: {EXAMPLES / 'train.py'}"))
    runs = tmp_path / "runs"
    rc, term = run([*ORCH, "submit", str(spec), "--wait", "--runs", str(runs)], cols=80, cwd=tmp_path, timeout=600)
    _no_crash(term.text)
    assert rc == 0, term.screen()
    assert [ln for ln in term.lines() if len(ln) > 80] == [], term.screen()
    job = re.search(r"as job (\S+)", term.text).group(1)  # type: ignore[union-attr]
    assert "COMPLETED" in term.screen()
    for param in TERMINALS:
        cols, no_color = param.values
        rc, term = run([*ORCH, "status", job, "--runs", str(runs)], cols=cols, cwd=tmp_path,
                       env={"NO_COLOR": "1"} if no_color else None)
        assert rc == 0 and "COMPLETED" in term.screen(), term.screen()
        _no_crash(term.text)
        assert [ln for ln in term.lines() if len(ln) > cols] == [], term.screen()
        if no_color:
            assert not COLOUR.search(term.text)
    p = subprocess.run([*ORCH, "status", job, "--runs", str(runs)], capture_output=True, cwd=tmp_path, timeout=60)
    assert p.returncode == 0 and b"\x1b" not in p.stdout + p.stderr and b"COMPLETED" in p.stdout
    rc, term = run([*ORCH, "cancel", job, "--runs", str(runs)], cols=80, cwd=tmp_path, timeout=300)
    _no_crash(term.text)
    assert rc == 0 and "cancelled" in term.screen(), term.screen()
    rc, term = run([*ORCH, "sweep", str(spec), "--set", "launch.args.5=0", "--runs", str(runs),
                    "--html", str(tmp_path / "sweep.html")], cols=160, cwd=tmp_path, timeout=600)
    _no_crash(term.text)
    assert rc == 0, term.screen()
    assert [ln for ln in term.lines() if len(ln) > 160] == [], term.screen()
    drawn = [ln for ln in _plain(term.raw).split("\r") if "sweep:" in ln and PROGRESS_LINE.search(ln)]
    assert drawn, "no progress display of the sweep's jobs"
    assert not [ln for ln in term.lines() if PROGRESS_LINE.search(ln)], term.screen()


@pytest.mark.fast
def test_a_task_over_several_nodes_says_how_far_each_is() -> None:
    """collect's exports and maps of a job on several nodes: each node's ranks done of its own,
    named up to progress.NODES_NAMED nodes, counted past that; one node: the task's words alone."""
    from orchestrator.progress import NODES_NAMED, Task

    t = Task(None, 0, "export", ["node2", "node1", "node1", "node2", "node1"])
    assert t.line() == "export (node1 0/3, node2 0/2)"
    for node in ("node1", "node2", "node1"):
        t.advance(node=node)
    assert t.line() == "export (node1 2/3, node2 1/2)"
    assert Task(None, 0, "map", ["vm", "vm"]).line() == "map"
    many = Task(None, 0, "map", [f"n{i}" for i in range(NODES_NAMED + 1) for _ in range(2)])
    many.advance(2, node="n0")
    many.advance(node="n1")
    assert many.line() == f"map (1 of {NODES_NAMED + 1} nodes done)"
