"""What recording a CUDA graph costs under nsys, beyond its CUDA calls: a calibration loop.

A loop that records a new CUDA graph for each new input shape (torch.compile's CUDA graph trees)
runs its recording steps much slower under nsys than the per-call estimate of
docs/capture_overhead.md explains. This loop times the same forward and backward of
modern_loops.py's GPT two ways, each in an NVTX range of its own: run eagerly (`eager N`), and
recorded into a new torch.cuda.CUDAGraph and replayed once (`capture N`), as a recording step
does. Run it once without a profiler and once under `nsys profile --trace=cuda,nvtx,osrt
--sample=none --cpuctxsw=none` (orch's trace set); `--calls EXPORT` then counts each range's CUDA
calls in that run's SQLite export with plain sqlite3. The slowdown of the eager ranges per call
is nsys' per-call cost on the machine; what the capture ranges lose beyond their calls at that
cost is nsys' cost of recording a graph.

    python graph_capture_cost.py --out bare.json
    nsys profile ... -o cap python graph_capture_cost.py --out nsys.json
    python graph_capture_cost.py --calls cap.sqlite --out calls.json
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import time

import torch
from modern_loops import GPT

# modern_loops.py's defaults: the GPT its loops train.
VOCAB, DIM, LAYERS, HEADS, SEQ, BATCH = 8192, 512, 6, 8, 256, 16


def timed(args: argparse.Namespace) -> dict[str, list[float]]:
    """ms of each eager and each capture iteration, the GPU synchronised around each."""
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = GPT(VOCAB, DIM, LAYERS, HEADS, SEQ).to(dev)
    x = torch.randint(0, VOCAB, (BATCH, SEQ), device=dev)
    y = torch.randint(0, VOCAB, (BATCH, SEQ), device=dev)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up on a side stream, as a capture needs
        for _ in range(3):
            model.zero_grad(set_to_none=True)
            model(x, y)[1].backward()
    torch.cuda.current_stream().wait_stream(side)
    out: dict[str, list[float]] = {"eager": [], "capture": []}
    for i in range(args.iters):
        for kind in ("eager", "capture"):
            model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.cuda.nvtx.range(f"{kind} {i}"):
                if kind == "eager":
                    model(x, y)[1].backward()
                else:
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        model(x, y)[1].backward()
                    graph.replay()
                torch.cuda.synchronize()
            out[kind].append((time.perf_counter() - t) * 1e3)
            if kind == "capture":
                del graph
    return out


def calls(export: str) -> dict[str, list[int]]:
    """CUDA calls (runtime and driver, every thread) inside each `eager N` / `capture N` range."""
    con = sqlite3.connect(export)
    rows = con.execute("""
        SELECT coalesce(e.text, s.value) AS name, count(r.start)
        FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId
        LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.start >= e.start AND r.start < e."end"
        WHERE coalesce(e.text, s.value) GLOB 'eager *' OR coalesce(e.text, s.value) GLOB 'capture *'
        GROUP BY e.start, name ORDER BY e.start""").fetchall()
    out: dict[str, list[int]] = {"eager": [], "capture": []}
    for name, n in rows:
        out[name.split()[0]].append(n)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="JSON file: the per-iteration figures and their medians")
    p.add_argument("--calls", help="count the CUDA calls of each range in this nsys SQLite export instead")
    p.add_argument("--iters", type=int, default=20)
    args = p.parse_args()
    got = calls(args.calls) if args.calls else timed(args)
    doc = {k: {"each": v, "median": statistics.median(v) if v else None} for k, v in got.items()}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(json.dumps({k: v["median"] for k, v in doc.items()}))


if __name__ == "__main__":
    main()
