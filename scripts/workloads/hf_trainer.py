"""GPT-2 small trained from scratch with the Hugging Face Trainer, the way its examples write it.

    python hf_trainer.py --accum 4 --steps 30 --workers 2          # gradient accumulation, 2 loader workers
    python hf_trainer.py --accum 1 --steps 30 --workers 0 --sample-ms 5
                                                                   # each sample tokenised in Python, in the loop
    python hf_trainer.py --accum 1 --steps 24 --workers 4 --epoch-steps 4 --no-persistent
                                                                   # 4-step epochs, workers forked every epoch
    python hf_trainer.py --accum 1 --steps 30 --workers 2 --fp16   # fp16=True: a GradScaler, whose
                                                                   # step reads found_inf (a host sync)
    python hf_trainer.py --accum 1 --batch 2 --compile default     # torch_compile=True, the Trainer's own

No NVTX of its own: what a profile shows of the loop is the Trainer's. bf16 on a GPU (`--fp16`:
fp16 with the Trainer's loss scaling). `--tiny`
makes the model small enough for a CPU rehearsal. `--repeat N` trains N times in one process and
prints each run's steady step time (no profiler needed): the optimizer steps after the first 5,
their mean and their median step.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

import torch
from modern_loops import tokenise
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class Texts(Dataset):
    """Token windows; `sample_ms` > 0: each sample first spends that long in Python (a dataset
    that tokenises its text in __getitem__)."""

    def __init__(self, n: int, seq: int, vocab: int, sample_ms: float) -> None:
        self.ids = torch.randint(0, vocab, (n, seq), generator=torch.Generator().manual_seed(0))
        self.sample_ms = sample_ms

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if self.sample_ms > 0:
            tokenise(self.sample_ms)
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class StepTimes(TrainerCallback):
    """The wall time of every optimizer step (the Trainer's own step end), for --repeat."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_step_end(self, args, state, control, **kwargs):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.ends.append(time.perf_counter())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=30, help="optimizer steps")
    p.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers")
    p.add_argument("--sample-ms", type=float, default=0.0, help="Python time per sample (a tokenising dataset)")
    p.add_argument("--epoch-steps", type=int, default=0,
                   help="optimizer steps an epoch of the dataset holds (0: one epoch holds them all)")
    p.add_argument("--no-persistent", action="store_true",
                   help="dataloader_persistent_workers=False, the Trainer's default: workers start anew every epoch")
    p.add_argument("--fp16", action="store_true", help="fp16=True (a GradScaler) instead of bf16 (GPU only)")
    p.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide model (CPU rehearsal)")
    p.add_argument("--compile", choices=("default", "reduce-overhead"), default=None,
                   help="TrainingArguments(torch_compile=True, torch_compile_mode=...)")
    p.add_argument("--repeat", type=int, default=1)
    a = p.parse_args()
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=2, n_positions=a.seq) if a.tiny else GPT2Config(n_positions=a.seq)
    data = Texts(a.batch * a.accum * (a.epoch_steps or a.steps + 1), a.seq, cfg.vocab_size, a.sample_ms)
    gpu = torch.cuda.is_available()
    times, medians = [], []
    for _ in range(a.repeat):
        torch.manual_seed(0)
        model = GPT2LMHeadModel(cfg)
        args = TrainingArguments(
            output_dir="/tmp/hf-trainer-out", max_steps=a.steps, per_device_train_batch_size=a.batch,
            gradient_accumulation_steps=a.accum, learning_rate=3e-4, bf16=gpu and not a.fp16, fp16=gpu and a.fp16,
            dataloader_num_workers=a.workers,
            dataloader_persistent_workers=a.workers > 0 and not a.no_persistent, dataloader_pin_memory=gpu,
            report_to="none",
            save_strategy="no", logging_steps=10, disable_tqdm=True, use_cpu=not gpu,
            torch_compile=a.compile is not None, torch_compile_mode=a.compile)
        clock = StepTimes()
        Trainer(model=model, args=args, train_dataset=data, callbacks=[clock]).train()
        steady = clock.ends[5:]
        times.append((steady[-1] - steady[0]) * 1e3 / (len(steady) - 1) if len(steady) > 1 else float("nan"))
        # each step on its own: a step that holds a once-a-run cost (the first logging step
        # creates a communicator) moves the mean, not the median
        each = [(b - a) * 1e3 for a, b in itertools.pairwise(steady)]
        medians.append(statistics.median(each) if each else float("nan"))
    print("steady step ms per run: " + " ".join(f"{t:.3f}" for t in times))
    print(f"steady step ms median: {statistics.median(times):.3f}")
    print("steady step ms, the median step of each run: " + " ".join(f"{t:.3f}" for t in medians))


if __name__ == "__main__":
    main()
