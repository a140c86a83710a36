"""orch's GPU time slices (gpu_slices, nsys' gpu-low-util rule done across ranks) against nsys'
own rule, `nsys analyze -r gpu-low-util`, over the same export and span: the Hugging Face
Trainer's capture (tests/fixtures/loops), whose GPU sits idle for 408 ms while NCCL creates its
communicator, so two of its 30 slices hold no GPU op at all.

nsys prints only the chunks under its threshold, consecutive ones merged into one record with
their mean in-use percentage; the test merges orch's slices the same way."""

from __future__ import annotations

import csv
import io
import lzma
import shutil
import subprocess
from pathlib import Path

import pytest

from orchestrator.api import open_store
from tests.stores import Stores

pytestmark = [pytest.mark.replay, pytest.mark.nsys]

EXPORT = Path(__file__).parent / "fixtures" / "loops" / "hf_gpt2_accum4_r0_vm.879.sqlite.xz"


def _nsys_low(nsys: str, export: Path, s0: int, s1: int, threshold: float) -> list[tuple[int, int, float]]:
    """(start, duration, in-use %) of each record nsys' gpu-low-util rule prints for [s0, s1]."""
    p = subprocess.run([nsys, "analyze", "-r", f"gpu-low-util:start={s0}:end={s1}:chunks=30:rows=100:"
                        f"threshold={threshold}", "-f", "csv", "-o", "-", str(export)],
                       capture_output=True, text=True, timeout=300, check=True)
    text = p.stdout[p.stdout.index("Row#"):]
    return sorted((int(r["Start (ns)"]), int(r["Duration (ns)"]), float(r["In-Use (%)"]))
                  for r in csv.DictReader(io.StringIO(text)))


def _merged(slices: list[dict], threshold: float) -> list[tuple[int, int, float]]:
    """orch's slices under `threshold`, consecutive ones merged as nsys merges its chunks."""
    out: list[list] = []
    for s in sorted(slices, key=lambda s: s["slice"]):
        if s["util_pct"] >= threshold:
            continue
        if out and out[-1][3] == s["slice"] - 1:
            run = out[-1]
            run[1], run[2], run[3] = run[1] + [s["util_pct"]], s["e"] - run[0], s["slice"]
        else:
            out.append([s["s"], [s["util_pct"]], s["e"] - s["s"], s["slice"]])
    return [(s, d, sum(u) / len(u)) for s, u, d, _ in out]


@pytest.mark.parametrize("threshold", [50, 5])
def test_slices_agree_with_nsys_gpu_low_util(stores: Stores, nsys: str, tmp_path: Path, threshold: float) -> None:
    run, _, _ = stores.report("loops-hf_gpt2_accum4")
    export = tmp_path / "hf.sqlite"
    with lzma.open(EXPORT, "rb") as src, open(export, "wb") as out:
        shutil.copyfileobj(src, out)
    with open_store(run / "profile.duckdb") as store:
        slices = store.view("gpu_slices").to_pylist()
        (r,) = store.table("ranks").to_pylist()
    off = r["clock_offset_ns"] + (r["clock_correction_ns"] or 0)  # the store's clock is the export's + off
    s0, s1 = min(s["s"] for s in slices) - off, max(s["e"] for s in slices) - off
    want = _nsys_low(nsys, export, s0, s1, threshold)
    got = [(s - off, d, pct) for s, d, pct in _merged(slices, threshold)]
    assert want, "nsys found no low chunk"
    assert len(got) == len(want), (got, want)
    for (gs, gd, gp), (ws, wd, wp) in zip(got, want, strict=True):
        # nsys rounds its chunk length up to a whole ns, orch cuts the span by integer division
        assert abs(gs - ws) <= 30 and abs(gd - wd) <= 30, ((gs, gd), (ws, wd))
        assert gp == pytest.approx(wp, abs=0.06), (gs, gp, wp)
    if threshold == 5:  # the two slices inside NCCL's communicator creation hold no GPU op
        assert [round(p, 1) for _, _, p in got] == [0.0]
