"""`python -m tests.truth [family ...]`: compute the truth of every real capture (or of the named
families) and write tests/fixtures/truth/<case>.json."""

from __future__ import annotations

import importlib
import sys

FAMILIES = ("pairs", "gpu_runs", "layouts", "single", "failing", "loops", "graphs")


def main(argv: list[str]) -> int:
    from tests.truth import write

    for fam in argv or FAMILIES:
        truths = importlib.import_module(f"tests.truth.{fam}").cases()
        write(truths)
        print(f"{fam}: {len(truths)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
