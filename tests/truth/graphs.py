"""Truth of the CUDA-graph pairs (tests/fixtures/graphs, README there: one H100, two device calls
on one machine): the eager GPT against the same step captured whole in one CUDA graph (the launch
fix alone: the same kernels, nothing fused), and the loop compiled with CUDA graphs at 0 and 4
DataLoader workers (the input fix, measured). Steps are counted by plain sqlite3 (the workload's
NVTX `step N` ranges, or clip_grad_norm_'s one `lpnorm_cleanup` kernel a step); what a fix saves
is the pair's difference, both in the captures (the NVTX steps' span) and in the loop's own
unprofiled timings (timings.json, the same machine: each `--repeat 3` run's steady step time,
the median taken)."""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from tests.truth import FIXTURES, Truth, opened, span_ms, step_count

GRAPHS = FIXTURES / "graphs"
LPNORM = ("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
          "WHERE s.value = 'lpnorm_cleanup'")
ROOT = "planted: the workload's arguments (graphs/README.md); a single process is rank 0"


def _export(stem: str) -> dict:
    return {"exports": [f"graphs/{next(GRAPHS.glob(f'{stem}_r0_*.sqlite.xz')).name}"]}


def cases() -> list[Truth]:
    timings = {k: statistics.median(v) for k, v in json.loads((GRAPHS / "timings.json").read_text()).items()}
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        spans, steps = {}, {}
        for stem in ("gpt_eager_nvtx", "gpt_eager_graphed_nvtx"):
            with opened(_export(stem), Path(tmp)) as cons:
                steps[stem] = step_count(cons, "step %")
                spans[stem] = span_ms(cons, "step %")
        n = steps["gpt_eager_nvtx"] - 1
        if steps["gpt_eager_graphed_nvtx"] != steps["gpt_eager_nvtx"]:
            raise ValueError(f"the graph pair holds different step counts: {steps}")
        out.append(Truth(
            case="graphs-gpt_eager_nvtx", input=_export("gpt_eager_nvtx"), cause="launch", root=[0],
            about="the eager GPT with NVTX `step N` ranges, 40 steps; nothing planted, launch-bound; its twin "
                  "replays the same step as one CUDA graph",
            steps=steps["gpt_eager_nvtx"],
            saving_ms=(spans["gpt_eager_nvtx"] - spans["gpt_eager_graphed_nvtx"]) / (n - 1) * n,
            saving_unprofiled_ms=(timings["gpt_eager"] - timings["gpt_eager_graphed"]) * n,
            how={"root": ROOT,
                 "steps": "plain sqlite3: the `step N` NVTX ranges",
                 "cause": "the eager GPT is launch-bound (nothing planted for it); its twin captures the whole "
                          "step (forward, backward, clip, AdamW) in one torch.cuda.CUDAGraph and replays it: the "
                          "same kernels launched at once, nothing fused (modern_loops.py --cuda-graph)",
                 "saving_ms": f"plain sqlite3: the mean step period from the second `step N` range's start to "
                              f"the last's ({n - 1} periods), minus the graphed twin's, times the {n} steps after "
                              "the first (same GPU UUID, same device call)",
                 "saving_unprofiled_ms": f"the loops' own unprofiled timings (timings.json, median of 3 runs "
                                         f"each): (gpt_eager - gpt_eager_graphed) x the {n} steps after the "
                                         "first"}))
        out.append(Truth(
            case="graphs-gpt_eager_graphed_nvtx", input=_export("gpt_eager_graphed_nvtx"), cause="none",
            about="the eager GPT's step captured whole in one CUDA graph and replayed, NVTX `step N` ranges, "
                  "40 steps; nothing planted",
            steps=steps["gpt_eager_graphed_nvtx"],
            how={"root": ROOT, "steps": "plain sqlite3: the `step N` NVTX ranges", "cause": "nothing planted"}))
        w0, w4 = timings["loops_compile_ro"], timings["loops_compile_ro_w4"]
        for stem, workers in (("loops_compile_ro", 0), ("loops_compile_ro_w4", 4)):
            with opened(_export(stem), Path(tmp)) as cons:
                (con,) = cons.values()
                n_steps = con.execute(LPNORM).fetchone()[0]
            out.append(Truth(
                case=f"graphs-{stem}", input=_export(stem), cause="none", steps=n_steps,
                about=f"modern_loops.py's GPT compiled with torch.compile(mode='reduce-overhead') (CUDA graphs), "
                      f"clip_grad_norm_ and AdamW eager, DataLoader num_workers={workers}, 40 optimizer steps, no "
                      "NVTX; orch's loop marks and Python samples on; nothing planted",
                how={"root": ROOT,
                     "steps": "plain sqlite3: optimizer steps, one `lpnorm_cleanup` kernel each (clip_grad_norm_)",
                     "cause": f"measured: unprofiled the loop runs {w0} ms a step at 0 DataLoader workers and "
                              f"{w4} ms at 4 (timings.json, median of 3 runs each, the same machine): more "
                              "workers save nothing, so its input is not what it waits for"}))
    return out
