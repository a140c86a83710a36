"""The fixtures' size budget (tests/fixtures/README.md): every case of the scoreboard stays under
20 MB of compressed exports, and a case added after the policy is xz-compressed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

FIXTURES = Path(__file__).parent / "fixtures"
BUDGET = 20_000_000
# The cases shipped as gzip before the policy; every other case is xz.
GZIP_BEFORE_XZ = frozenset((
    "comm-ddp", "comm-nvlink", "comm-socket", "faults-cancel", "faults-extra-collective", "faults-oom-1gpu",
    "faults-oom", "faults-raise", "faults-sigkill", "faults-timeout", "faults-watchdog-4gpu", "faults-watchdog",
    "gpu_e2e-ddp", "gpu_e2e-ok", "gpu_e2e-pp", "h200-ddp_capture", "h200-ddp_straggler", "h200-pp_imbalance",
    "layouts-dp2pp2-slow-loader-one-per-stage", "layouts-tp2-rerun", "layouts-tp2",
    "layouts-tp2dp2-one-per-stage", "layouts-tp2dp2", "modern-gpt_compile_ro_graphtrace",
    "modern-gpt_compile_ro_nodetrace", "modern-gpt_eager_accum4", "modern-gpt_eager_emptycache_memusage",
    "modern-gpt_eager_keepoutputs_memusage", "modern-gpt_eager_memusage", "modern-gpt_eager_nvtx",
    "modern-resnet18_pageable_nvtx", "pairs-cpu-straggler", "pairs-ddp-accum-rerun", "pairs-ddp-accum",
    "pairs-ddp2-healthy", "pairs-ddp2-input-bound", "pairs-ddp2-slow-loader", "pairs-ddp4-healthy-rerun",
    "pairs-ddp4-healthy", "pairs-ddp4-slow-loader", "pairs-gpu-straggler", "pairs-healthy", "pairs-pp-even-h200",
    "pairs-pp-even", "pairs-pp-slow-input", "pairs-pp-uneven", "pairs-pp4-even-rerun", "pairs-pp4-even",
    "pairs-pp4-slow-loader", "pairs-pp4-uneven", "real-1f1b_m8", "real-ddp_slowrank", "real-gpipe_m4",
    "real-healthy", "real-item_sync", "real-resnet_nw0", "real-resnet_nw2", "stats-cpu",
))


def _cases() -> dict[str, list[Path]]:
    out = {}
    for f in sorted((FIXTURES / "truth").glob("*.json")):
        spec = json.loads(f.read_text())["input"]
        out[f.stem] = (sorted((FIXTURES / spec["run"] / "exports").glob("*.sqlite.*")) if "run" in spec
                       else [FIXTURES / x for x in spec["exports"]])
    return out


def test_every_case_fits_the_budget_and_a_new_one_is_xz() -> None:
    cases = _cases()
    assert not GZIP_BEFORE_XZ - set(cases), sorted(GZIP_BEFORE_XZ - set(cases))
    over = {c: sum(f.stat().st_size for f in fs) for c, fs in cases.items()}
    over = {c: n for c, n in over.items() if n > BUDGET}
    assert not over, f"cases over {BUDGET / 1e6:.0f} MB of exports (tests/fixtures/README.md): {over}"
    gzip = sorted(c for c, fs in cases.items() if c not in GZIP_BEFORE_XZ and any(f.suffix != ".xz" for f in fs))
    assert not gzip, f"new cases must be xz-compressed (tests/fixtures/README.md): {gzip}"
