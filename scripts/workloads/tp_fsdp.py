"""2-D parallel training of a Llama-style transformer: tensor parallelism with DTensor
(ColwiseParallel / RowwiseParallel through parallelize_module) over the "tp" mesh dimension
and FSDP2 (fully_shard, bf16 parameters, fp32 gradient reduction) over "dp", on a 2-D
DeviceMesh ("dp", "tp"): rank = dp_index * tp + tp_index. One NVTX range `step N` per step.

    torchrun --nproc_per_node 4 tp_fsdp.py --tp 2 --dp 2
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class Attention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads  # divided by the TP degree after parallelize_module
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, dim, n_heads, hidden):
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = nn.RMSNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Transformer(nn.Module):
    def __init__(self, vocab, dim, n_layers, n_heads, hidden, max_seq):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.randn(max_seq, dim) * 0.02)
        self.layers = nn.ModuleList(Block(dim, n_heads, hidden) for _ in range(n_layers))
        self.norm = nn.RMSNorm(dim)
        self.output = nn.Linear(dim, vocab, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) + self.pos[: tokens.shape[1]]
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--dim", type=int, default=4096)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--hidden", type=int, default=11008)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4, help="per data-parallel replica")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--log-every", type=int, default=4, help="rank 0 prints the loss every N steps (0: never)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()

    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    mesh = init_device_mesh(args.device, (args.dp, args.tp), mesh_dim_names=("dp", "tp"))
    tp_mesh, dp_mesh = mesh["tp"], mesh["dp"]
    rank = dist.get_rank()
    device = torch.device(args.device, torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")

    torch.manual_seed(0)
    model = Transformer(args.vocab, args.dim, args.layers, args.heads, args.hidden, args.seq).to(device)
    for block in model.layers:
        parallelize_module(block, tp_mesh, {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
        })
        block.attention.n_heads = args.heads // tp_mesh.size()
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.layers:
        fully_shard(block, mesh=dp_mesh, mp_policy=mp)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, foreach=True)
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"{args.layers} layers x {args.dim}: {n / 1e6:.0f}M parameters held per rank, mesh {mesh}", flush=True)

    # Every rank of a TP group must see the same tokens: seed by the data-parallel index.
    g = torch.Generator().manual_seed(100 + mesh.get_local_rank("dp"))
    t0 = time.perf_counter()
    for step in range(args.steps):
        with torch.cuda.nvtx.range(f"step {step}"):
            tokens = torch.randint(0, args.vocab, (args.batch, args.seq + 1), generator=g).to(device)
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        if args.log_every and step % args.log_every == args.log_every - 1 and rank == 0:
            ms = (time.perf_counter() - t0) * 1000 / args.log_every
            print(f"step {step} loss {loss.item():.3f} {ms:.0f} ms/step", flush=True)
            t0 = time.perf_counter()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
