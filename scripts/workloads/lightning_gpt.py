"""modern_loops.py's small GPT trained with PyTorch Lightning, the way its docs write it.

    python lightning_gpt.py --accum 4 --steps 20 --workers 2     # accumulate_grad_batches=4, clipping

No NVTX of its own: what a profile shows of the loop is Lightning's. bf16-mixed on a GPU.
`--repeat N` trains N times in one process and prints each run's steady step time (no profiler
needed): the optimizer steps after the first 5.
"""

from __future__ import annotations

import argparse
import statistics
import time

import lightning as L
import torch
from modern_loops import GPT, Tokens
from torch.utils.data import DataLoader


class LitGPT(L.LightningModule):
    def __init__(self, a: argparse.Namespace) -> None:
        super().__init__()
        self.a = a
        self.model = GPT(a.vocab, a.dim, a.layers, a.heads, a.seq)

    def training_step(self, batch, batch_idx):
        x, y = batch
        _, loss = self.model(x, y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-4, weight_decay=0.1)


class StepTimes(L.Callback):
    """The wall time of every optimizer step's end, for --repeat."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_before_zero_grad(self, trainer, pl_module, optimizer) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.ends.append(time.perf_counter())


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
        loader = DataLoader(data, batch_size=a.batch, shuffle=True, drop_last=True, num_workers=a.workers,
                            pin_memory=gpu, persistent_workers=a.workers > 0)
        clock = StepTimes()
        trainer = L.Trainer(max_steps=a.steps, accumulate_grad_batches=a.accum, gradient_clip_val=1.0,
                            precision="bf16-mixed" if gpu else "32-true", accelerator="gpu" if gpu else "cpu",
                            devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, callbacks=[clock])
        trainer.fit(LitGPT(a), loader)
        steady = clock.ends[5:]
        times.append((steady[-1] - steady[0]) * 1e3 / (len(steady) - 1) if len(steady) > 1 else float("nan"))
    print("steady step ms per run: " + " ".join(f"{t:.3f}" for t in times))
    print(f"steady step ms median: {statistics.median(times):.3f}")


if __name__ == "__main__":
    main()
