"""The cost of orch's loop marks (templates/orch_loop_marks.py.j2): one NVTX range pushed and
popped as the rank hook does it, per pair, in microseconds; and with `--sampler MS` the cost of
its Python sampler to the sampled thread: the same pure-Python work (a tokeniser's stand-in, 40
frames deep) timed with the sampler off and on, alternating, the slowdown in % (every sample
finds the same function: the cost of a sample, not of a range). Run it under
nsys to see the profiled cost, which is what a marked step pays:

    python scripts/bench_loop_marks.py [--pairs 20000] [--sampler 10]
    nsys profile -t nvtx -s none --cpuctxsw none -o /tmp/marks python scripts/bench_loop_marks.py

Not a test: the number depends on the machine. A step pays one pair per optimizer step and one
per batch it waits for (docs in tests/fixtures/loops/README.md).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "orch_loop_marks.py.j2"


def hook():  # the template's module
    """The hook's own code, rendered with the spec's defaults."""
    import jinja2

    text = jinja2.Template(TEMPLATE.read_text()).render(job={"spec": {"name": "bench"}}, version="bench",
                                                       loop_marks=True, python_sampling_ms=10)
    path = Path(tempfile.mkdtemp()) / "orch_loop_marks.py"
    path.write_text(text)
    loader = importlib.machinery.SourceFileLoader("orch_loop_marks", str(path))
    spec = importlib.util.spec_from_loader("orch_loop_marks", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


def work(depth: int, n: int) -> int:
    """`n` rounds of byte-pair counting, `depth` frames below the caller."""
    if depth:
        return work(depth - 1, n)
    text, total = "the quick brown fox jumps over the lazy dog " * 4, 0
    for _ in range(n):
        pairs: dict[str, int] = {}
        for a, b in itertools.pairwise(text):
            pairs[a + b] = pairs.get(a + b, 0) + 1
        total += len(pairs)
    return total


def handler_cost(mod, depth: int = 40, n: int = 20000) -> None:
    """One sample's own cost, called directly `depth` frames down: the whole-work rounds below
    vary by several per cent from round to round, more than the sampler costs at 10 ms."""
    import nvtx

    s = mod._Sampler(10)
    s.nvtx = nvtx

    def down(d: int) -> float:
        if d:
            return down(d - 1)
        frame = sys._getframe()
        t = time.perf_counter()
        for _ in range(n):
            s.sample(None, frame)
        return (time.perf_counter() - t) / n * 1e6

    us = down(depth)
    print(f"us per sample ({depth} frames deep, {n} samples): {us:.2f}; at a sample every 10 ms: {us / 100:.3f} %")


def sampler_cost(mod, ms: int, rounds: int = 7, n: int = 20000) -> None:
    """The work timed without the sampler, with its timer and a handler that does nothing (what
    the signals cost), and with the sampler itself, alternating."""
    times: dict[str, list[float]] = {"off": [], "signals": [], "sampler": []}
    work(40, n // 10)  # warm-up
    for _ in range(rounds):
        for what, got in times.items():
            s = mod._Sampler(ms)
            if what == "signals":
                s.sample = lambda signum, frame: None
            if what != "off":
                s.start()
            t = time.perf_counter()
            work(40, n)
            got.append(time.perf_counter() - t)
            if what != "off":
                s.stop()
    off = statistics.median(times["off"])
    print(f"sampler every {ms} ms: work {off * 1e3:.1f} ms off; " + "; ".join(
        f"{w} {statistics.median(v) * 1e3:.1f} ms ({100 * (statistics.median(v) - off) / off:+.2f} %)"
        for w, v in times.items() if w != "off") + f" (medians of {rounds})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=20000)
    p.add_argument("--sampler", type=int, default=0, metavar="MS", help="also time the Python sampler at MS")
    a = p.parse_args()
    mod = hook()
    m = mod._Marks(True, None)
    for label in ("warm-up", "timed"):
        t = time.perf_counter()
        for _ in range(a.pairs):
            m.push("orch: next batch")
            m.pop()
        us = (time.perf_counter() - t) / a.pairs * 1e6
        print(f"us per push+pop ({label}, {a.pairs} pairs): {us:.2f}")
    if a.sampler:
        handler_cost(mod)
        sampler_cost(mod, a.sampler)


if __name__ == "__main__":
    main()
