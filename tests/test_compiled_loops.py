"""A loop compiled with torch.compile's default mode (Inductor's fused Triton kernels, no CUDA
graphs) at a batch small enough that its launches bound it, on real captures (tests/fixtures/loops,
README there, one H100): the launch-bound finding tells it to compile with CUDA graphs, not to adopt
torch.compile, and names how many of its kernels are Inductor's; the same loop with a graph break
in every block the same, and the HF Trainer compiling GPT-2 itself (torch_compile=True), whose
loop thread's time under AOTAutograd's wrappers gets the compile's fix, not a Dataset's; the loop's
twin compiled with CUDA graphs has nothing above `info`.

The kernels are counted independently, with plain sqlite3 over the export: Inductor's are the
kernels whose short name starts with `triton_`, inside orch's window (from the first `orch:
optimizer.step` range's end to the last's)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from tests.stores import Stores, loop_export
from tests.truth.loops import opt_window

pytestmark = pytest.mark.replay

TRITON = ("SELECT sum(s.value LIKE 'triton\\_%' ESCAPE '\\'), count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
          "JOIN StringIds s ON s.id = k.shortName WHERE k.start >= ? AND k.start < ?")


def _kernels(export: Path) -> tuple[int, int]:
    """(Inductor's kernels, all kernels) starting in the window, by plain sqlite3."""
    con = sqlite3.connect(export)
    try:
        return con.execute(TRITON, opt_window(con)).fetchone()
    finally:
        con.close()


@pytest.mark.parametrize("stem", ["gpt_compile_default_b4", "gpt_compile_breaks_b4", "hf_gpt2_compile_b2"])
def test_a_compiled_launch_bound_loop_is_told_to_add_cuda_graphs(stores: Stores, tmp_path: Path, stem: str) -> None:
    _, report, _ = stores.report(f"loops-{stem}")
    top = report["findings"][0]
    assert (top["kind"], top["ranks"], top["severity"]) == ("launch_bound", [0], "high")
    assert top["fix"].startswith("The GPU waits on kernel launches, and the loop already runs torch.compile")
    assert "mode='reduce-overhead'" in top["fix"]
    (line,) = [e for e in top["evidence"] if "Inductor's generated Triton kernels" in e]
    got = re.match(r"rank 0: ([\d,]+) of its ([\d,]+) kernels", line)
    triton, total = _kernels(loop_export(stem, tmp_path))
    assert int(got.group(1).replace(",", "")) == triton and triton > 0.4 * total
    assert abs(int(got.group(2).replace(",", "")) - total) <= 0.001 * total  # the window's edge: a kernel or two
    # no cause named from a handful of Python samples; a function under torch.compile's runtime
    # gets the compile's fix
    for f in report["findings"]:
        if f["kind"] == "cpu_gap" and f["severity"] != "info":
            assert "torch/_functorch/" in f["title"] and "torch.compile's own Python" in f["fix"], f["title"]
            assert "Dataset" not in f["fix"]


def test_its_twin_with_cuda_graphs_has_nothing_above_info(stores: Stores) -> None:
    _, report, _ = stores.report("loops-gpt_compile_ro_b4")
    assert not [f for f in report["findings"] if f["severity"] != "info"]
