"""DDP as in PyTorch's "Getting Started with Distributed Data Parallel" tutorial (ToyModel,
SGD, MSE), with the evaluation most training scripts add: every few steps the main process
evaluates the model and averages the validation loss with the shared `mean_across_ranks`
helper. Every step is an NVTX range `step N` (PyPI `nvtx`, recorded on CPU too).

    torchrun --nproc_per_node 2 ddp_tutorial_eval.py --steps 40 --eval-every 10
"""
import argparse

import nvtx
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(512, 1024)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(1024, 64)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def mean_across_ranks(value: torch.Tensor) -> torch.Tensor:
    value = value.detach().clone()
    dist.all_reduce(value)
    return value / dist.get_world_size()


@torch.no_grad()
def evaluate(model, batches):
    model.eval()
    loss = sum(nn.functional.mse_loss(model(x), y) for x, y in batches) / len(batches)
    model.train()
    return mean_across_ranks(loss)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--eval-every", type=int, default=10)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DDP(ToyModel())
    opt = optim.SGD(model.parameters(), lr=0.001)
    val = [(torch.randn(32, 512), torch.randn(32, 64)) for _ in range(4)]
    for step in range(args.steps):
        with nvtx.annotate(f"step {step}"):
            x, y = torch.randn(64, 512), torch.randn(64, 64)
            with nvtx.annotate("forward"):
                loss = nn.functional.mse_loss(model(x), y)
            with nvtx.annotate("backward"):
                opt.zero_grad()
                loss.backward()
            with nvtx.annotate("optimizer"):
                opt.step()
            if rank == 0 and step > 0 and step % args.eval_every == 0:
                with nvtx.annotate("evaluate"):
                    print(f"step {step}: val loss {evaluate(model.module, val).item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
