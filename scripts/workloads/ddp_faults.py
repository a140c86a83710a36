"""The tutorial's ResNet-50 DDP trainer (seed 003, section 2.1.1; resnet_ddp.py beside this
file) with the faults that stop real multi-GPU jobs, each where a user's code has it:

- stuck-loader: one rank's dataset read blocks (a hung network filesystem): its DataLoader
  never returns, the other ranks wait in DDP's all-reduce until the time limit or NCCL's
  watchdog (`--nccl-timeout`, the `timeout` users give init_process_group).
- oom: one rank gets a batch 64 times larger (a long sample, a bad bucketing): OutOfMemoryError.
- leak: one rank keeps a copy of each step's input on the GPU (a debugging cache) until it
  runs out of memory.
- extra-collective: one rank averages its loss across ranks for its log line, the others do
  not (`if rank == 0: dist.all_reduce(...)`): the ranks' collectives no longer match.
- raise: one rank's dataset raises on a corrupt sample.
- sigkill: one rank is killed (as the kernel's OOM killer kills a process).

And three slowdowns that stop nothing, for the cost of a straggler (`--fault-step 0`):
- gpu-straggler: one rank probes its loss landscape every step, 8 extra 3072x3072 GEMMs on
  its GPU after the optimizer step.
- cpu-straggler: one rank writes its metrics synchronously to a slow filesystem every step
  (15 ms on the host before its forward pass).
- slow-loader: one rank's DataLoader has 2 workers instead of `--num-workers` (a node with
  fewer free cores, a worker count computed from the wrong CPU count).
A slow input pipeline is `--num-workers 0` (every rank decodes its own batches).
Gradient accumulation is `--accum K`: each loader batch is a micro-batch in its own `Step N Start`
range (the tutorial's loop, one range per batch), its gradients kept local with DDP's no_sync()
until the K-th, whose backward all-reduces them before the optimizer step.

    torchrun --nproc_per_node 4 ddp_faults.py --steps 40 --fault stuck-loader --fault-rank 2 --fault-step 12
"""

import argparse
import contextlib
import io
import os
import random
import signal
import time
from datetime import timedelta

import numpy as np
import torch
import torch.cuda.nvtx as nvtx
import torch.distributed as dist
import torch.nn.functional as F
import torchvision.transforms as T
from PIL import Image
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from torchvision import models


class SyntheticDataset(Dataset):
    """ImageNet-style samples: a JPEG decoded and augmented per sample, with a random label."""

    def __init__(self, length: int, fault: str, fault_rank: int, first_bad: int) -> None:
        self.len = length
        self.fault, self.fault_rank, self.first_bad = fault, fault_rank, first_bad
        rng = np.random.default_rng(0)
        self.jpegs = []
        for _ in range(16):
            small = rng.integers(0, 256, (47, 63, 3), dtype=np.uint8)
            buf = io.BytesIO()
            Image.fromarray(small).resize((500, 375), Image.BILINEAR).save(buf, format="JPEG", quality=90)
            self.jpegs.append(buf.getvalue())
        self.transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(),
                                    T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])])

    def read(self, idx: int) -> bytes:
        if int(os.environ["RANK"]) == self.fault_rank and idx >= self.first_bad:
            if self.fault == "stuck-loader":
                time.sleep(3600)  # the read never returns
            if self.fault == "raise":
                raise ValueError(f"sample {idx}: corrupt JPEG (cannot identify image file)")
        return self.jpegs[idx % len(self.jpegs)]

    def __getitem__(self, idx: int):
        img = Image.open(io.BytesIO(self.read(idx))).convert("RGB")
        return self.transform(img), random.randint(0, 999)

    def __len__(self) -> int:
        return self.len


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=32, help="per GPU")
    p.add_argument("--num-workers", type=int, default=4)
    p.add_argument("--fault", default="none",
                   choices=["none", "stuck-loader", "oom", "leak", "extra-collective", "raise", "sigkill",
                            "gpu-straggler", "cpu-straggler", "slow-loader"])
    p.add_argument("--fault-rank", type=int, default=-1)
    p.add_argument("--fault-step", type=int, default=10**9)
    p.add_argument("--nccl-timeout", type=float, default=600.0)
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--bind-cpus", action="store_true",
                   help="pin each rank (and its DataLoader workers) to an equal share of the machine's cores")
    p.add_argument("--log-every", type=int, default=0, help="rank 0 prints `step N` every N steps")
    a = p.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    if a.bind_cpus:  # before the DataLoader forks its workers: they inherit the binding
        cores = sorted(os.sched_getaffinity(0))
        share = len(cores) // int(os.environ["LOCAL_WORLD_SIZE"])
        os.sched_setaffinity(0, cores[local_rank * share:(local_rank + 1) * share])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", timeout=timedelta(seconds=a.nccl_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    # DistributedSampler without shuffling gives rank r the samples r, r + world, ...: step s
    # of rank r starts at sample (s * batch) * world + r.
    dataset = SyntheticDataset(a.steps * a.batch * world, a.fault, a.fault_rank, a.fault_step * a.batch * world)
    loader = DataLoader(dataset, batch_size=a.batch, sampler=DistributedSampler(dataset, shuffle=False),
                        num_workers=2 if rank == a.fault_rank and a.fault == "slow-loader" else a.num_workers,
                        pin_memory=True)
    model = DDP(models.resnet50(weights=None).to(local_rank), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    mine = rank == a.fault_rank
    kept = []
    probe = torch.randn(3072, 3072, device=local_rank)

    nvtx.range_push("Entire training")
    starts = []  # each step's start, for the time printed at the end (unprofiled runs too)
    for step, (source, targets) in enumerate(loader):
        starts.append(time.perf_counter())
        nvtx.range_push(f"Step {step} Start")
        if a.log_every and rank == 0 and step % a.log_every == 0:
            print(f"step {step}", flush=True)
        source, targets = source.to(local_rank, non_blocking=True), targets.to(local_rank, non_blocking=True)
        if mine and step >= a.fault_step and a.fault == "oom":
            source, targets = source.repeat(64, 1, 1, 1), targets.repeat(64)
        if mine and step >= a.fault_step and a.fault == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mine and step >= a.fault_step and a.fault == "cpu-straggler":
            with open(os.devnull, "w") as log:
                time.sleep(0.015)  # the write to a slow filesystem
                print(f"step {step}", file=log)
        if step % a.accum == 0:
            optimizer.zero_grad()
        last_micro = (step + 1) % a.accum == 0
        with contextlib.nullcontext() if last_micro else model.no_sync():
            with nvtx.range("Forward Pass"):
                output = model(source)
            loss = F.cross_entropy(output, targets) / a.accum
            with nvtx.range("Backward Pass"):
                loss.backward()
        if last_micro:
            with nvtx.range("Optimizer Step"):
                optimizer.step()
        if mine and step >= a.fault_step and a.fault == "gpu-straggler":
            with nvtx.range("Loss landscape probe"):
                for _ in range(8):
                    probe = torch.tanh(probe @ probe * 1e-3)
        if mine and a.fault == "leak":
            kept.append(source.detach().repeat(80, 1, 1, 1))  # about 1.5 GiB a step
        if mine and step == a.fault_step and a.fault == "extra-collective":
            mean = loss.detach().clone()
            dist.all_reduce(mean)
            print(f"step {step}: mean loss {mean.item() / world:.3f}", flush=True)
        nvtx.range_pop()
    nvtx.range_pop()
    torch.cuda.synchronize()
    if len(starts) > 2:
        print(f"rank {rank}: steps 1-{len(starts) - 1} from start to start {1000 * (starts[-1] - starts[1]):.1f} ms",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
