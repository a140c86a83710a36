"""modern_loops.py's small GPT in a plain loop with Hugging Face Accelerate, the way its docs write
gradient accumulation:

    python accelerate_gpt.py --accum 4 --steps 20 --workers 2

`accelerator.accumulate(model)` around every micro-batch, `optimizer.step()` called on every one
(Accelerate's optimizer wrapper steps the real optimizer only when the gradients are synced),
clipping only then. No NVTX of its own; bf16 on a GPU. `--repeat N` trains N times in one
process and prints each run's steady step time (no profiler needed): the optimizer steps after
the first 5.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from accelerate import Accelerator
from modern_loops import GPT, Tokens
from torch.utils.data import DataLoader


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20, help="optimizer steps")
    p.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    p.add_argument("--repeat", type=int, default=1)
    a = p.parse_args()
    gpu = torch.cuda.is_available()
    data = Tokens(a.batch * a.accum * (a.steps + 1), a.seq, a.vocab)
    times = []
    for _ in range(a.repeat):
        torch.manual_seed(0)
        accelerator = Accelerator(gradient_accumulation_steps=a.accum, mixed_precision="bf16" if gpu else "no",
                                  cpu=not gpu)
        model = GPT(a.vocab, a.dim, a.layers, a.heads, a.seq)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
        loader = DataLoader(data, batch_size=a.batch, shuffle=True, drop_last=True, num_workers=a.workers,
                            pin_memory=gpu, persistent_workers=a.workers > 0)
        model, opt, loader = accelerator.prepare(model, opt, loader)
        model.train()
        ends: list[float] = []
        for i, (x, y) in enumerate(loader):
            if i >= a.steps * a.accum:
                break
            with accelerator.accumulate(model):
                _, loss = model(x, y)
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad()
            if accelerator.sync_gradients:
                if gpu:
                    torch.cuda.synchronize()
                ends.append(time.perf_counter())
        steady = ends[5:]
        times.append((steady[-1] - steady[0]) * 1e3 / (len(steady) - 1) if len(steady) > 1 else float("nan"))
    print("steady step ms per run: " + " ".join(f"{t:.3f}" for t in times))
    print(f"steady step ms median: {statistics.median(times):.3f}")


if __name__ == "__main__":
    main()
