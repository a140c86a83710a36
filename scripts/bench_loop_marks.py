"""The cost of orch's loop marks (templates/orch_loop_marks.py.j2): one NVTX range pushed and
popped as the rank hook does it, per pair, in microseconds. Run it under nsys to see the
profiled cost, which is what a marked step pays:

    python scripts/bench_loop_marks.py [--pairs 20000]
    nsys profile -t nvtx -s none --cpuctxsw none -o /tmp/marks python scripts/bench_loop_marks.py

Not a test: the number depends on the machine. A step pays one pair per optimizer step and one
per batch it waits for (docs in tests/fixtures/loops/README.md).
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import time
from pathlib import Path

TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "orch_loop_marks.py.j2"


def marks():  # the template's _Marks
    """The hook's own code: the template is Python as it stands (its Jinja is in its docstring)."""
    loader = importlib.machinery.SourceFileLoader("orch_loop_marks", str(TEMPLATE))
    spec = importlib.util.spec_from_loader("orch_loop_marks", loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod._Marks()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=20000)
    a = p.parse_args()
    m = marks()
    for label in ("warm-up", "timed"):
        t = time.perf_counter()
        for _ in range(a.pairs):
            m.push("orch: next batch")
            m.pop()
        us = (time.perf_counter() - t) / a.pairs * 1e6
        print(f"us per push+pop ({label}, {a.pairs} pairs): {us:.2f}")


if __name__ == "__main__":
    main()
