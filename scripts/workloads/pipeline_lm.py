"""Pipeline-parallel training of a decoder-only transformer LM with
torch.distributed.pipelining: the model is split by hand into `world` stages (embedding and
the first layers on stage 0, the last layers, final norm and LM head on the last stage), one
stage per rank, driven by ScheduleGPipe or Schedule1F1B. One NVTX range `step N` per
training step.

    torchrun --nproc_per_node 2 pipeline_lm.py --schedule gpipe --microbatches 4
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class StageModule(nn.Module):
    """The layers [lo, hi) of the LM; the first stage embeds, the last one projects to the vocabulary."""

    def __init__(self, vocab, dim, heads, seq, lo, hi, first, last):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim) if first else None
        self.pos = nn.Parameter(torch.zeros(seq, dim)) if first else None
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(lo, hi))
        self.norm = nn.LayerNorm(dim) if last else None
        self.head = nn.Linear(dim, vocab, bias=False) if last else None

    def forward(self, x):
        if self.tok is not None:
            x = self.tok(x) + self.pos[: x.shape[1]]
        for layer in self.layers:
            x = layer(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def lm_loss(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="gpipe")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--batch", type=int, default=32, help="global batch (split into microbatches)")
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()

    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if args.device == "cuda":
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        device = torch.device("cpu")
    torch.manual_seed(1234 + rank)

    per_stage = args.layers // world
    lo, hi = rank * per_stage, (rank + 1) * per_stage
    first, last = rank == 0, rank == world - 1
    model = StageModule(args.vocab, args.dim, args.heads, args.seq, lo, hi, first, last).to(device)
    stage = PipelineStage(model, rank, world, device)
    if args.schedule == "gpipe":
        schedule = ScheduleGPipe(stage, n_microbatches=args.microbatches, loss_fn=lm_loss)
    else:
        schedule = Schedule1F1B(stage, n_microbatches=args.microbatches, loss_fn=lm_loss)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    print(f"rank {rank}: layers {lo}..{hi - 1}, {sum(q.numel() for q in model.parameters()) / 1e6:.0f}M params, "
          f"{args.schedule} x{args.microbatches}", flush=True)

    g = torch.Generator().manual_seed(0)
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g)
        x = tokens[:, :-1].to(device)
        y = tokens[:, 1:].to(device)
        t0 = time.perf_counter()
        with torch.cuda.nvtx.range(f"step {step}"):
            optimizer.zero_grad(set_to_none=True)
            if first:
                schedule.step(x)
            elif last:
                losses = []
                schedule.step(target=y, losses=losses)
            else:
                schedule.step()
            optimizer.step()
        if last:
            loss = torch.stack(losses).mean().item()
            print(f"step {step} loss {loss:.3f} {1000 * (time.perf_counter() - t0):.0f} ms", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
