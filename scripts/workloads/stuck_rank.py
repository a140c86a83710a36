"""A data-parallel training loop as it is often instrumented by hand: DDP, one NVTX range per
step (`train_step`) and nothing inside it. gloo on CPU, NCCL on GPU.

One rank can be made to stall in its data read (`--stuck-rank R --stuck-step N`): it blocks in
`time.sleep` inside `read_batch` (a read from a network store that never returns), while the
others wait for it in DDP's gradient all-reduce, inside their backward. Every rank is then in
its `train_step` range: the NVTX ranges cannot tell the stuck rank from the waiting ones; its
main thread's stack can.

Or one rank can call a collective the others never call (`--resync-rank R --resync-step N`): the
rank that reloaded its shard re-syncs its weights from rank 0 with `dist.broadcast`, while the
others go on to their backward's all-reduce. `--pg-timeout-s S` gives the process group the
timeout users give `init_process_group`, after which a collective that waits raises.

Or one rank can hand its losses to a metrics uploader thread (`--uploader-rank R`), started as
threads usually are (not a daemon) and never told to stop: the rank finishes every step, prints
its last line, and its process never ends (the interpreter waits for the thread at exit).

    torchrun --nproc_per_node 4 stuck_rank.py --steps 50 --stuck-rank 3 --stuck-step 5
"""

from __future__ import annotations

import argparse
import os
import queue
import threading
import time
from datetime import timedelta

import nvtx
import torch
import torch.distributed as dist
from torch import nn


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--stuck-rank", type=int, default=-1)
    p.add_argument("--stuck-step", type=int, default=5)
    p.add_argument("--stuck-s", type=float, default=3600.0)
    p.add_argument("--resync-rank", type=int, default=-1)
    p.add_argument("--resync-step", type=int, default=5)
    p.add_argument("--pg-timeout-s", type=float, default=0.0)
    p.add_argument("--uploader-rank", type=int, default=-1)
    return p.parse_args()


def read_batch(rank: int, step: int, a: argparse.Namespace) -> torch.Tensor:
    """The next batch of this rank's shard (here made up; a real loop reads it from storage)."""
    if rank == a.stuck_rank and step == a.stuck_step:
        time.sleep(a.stuck_s)  # the read that never returns
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(a.batch, a.width, generator=g)


def upload(losses: queue.Queue) -> None:
    """Post each loss to the metrics service as it comes (here: there is none to post to)."""
    while True:
        losses.get()


def resync(model: nn.Module) -> None:
    """Take rank 0's weights again (after this rank reloaded its shard)."""
    for p in model.parameters():
        dist.broadcast(p.data, src=0)


def train_step(model: nn.Module, opt: torch.optim.Optimizer, rank: int, step: int,
               a: argparse.Namespace, dev: torch.device) -> torch.Tensor:
    x = read_batch(rank, step, a).to(dev)
    if rank == a.resync_rank and step == a.resync_step:
        resync(model)
    loss = model(x).pow(2).mean()
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return loss.detach()


def main() -> None:
    a = parse()
    cuda = torch.cuda.is_available()
    timeout = {"timeout": timedelta(seconds=a.pg_timeout_s)} if a.pg_timeout_s else {}
    dist.init_process_group("nccl" if cuda else "gloo", **timeout)
    rank = dist.get_rank()
    local = int(os.environ.get("LOCAL_RANK", 0))
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = nn.Sequential(nn.Linear(a.width, a.width), nn.ReLU(), nn.Linear(a.width, a.width)).to(dev)
    model = nn.parallel.DistributedDataParallel(net, device_ids=[local] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses: queue.Queue = queue.Queue()
    if rank == a.uploader_rank:
        threading.Thread(target=upload, args=(losses,), name="uploader").start()
    for step in range(a.steps):
        with nvtx.annotate("train_step"):
            loss = train_step(model, opt, rank, step, a, dev)
        losses.put(float(loss))
        if rank == 0 and step % 10 == 0:
            print(f"step {step}: loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
