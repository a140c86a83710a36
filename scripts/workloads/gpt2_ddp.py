"""Train a GPT-2 (transformers, randomly initialised from a GPT2Config) with DDP on random
token sequences. No NVTX. Prints the loss every `--log-every` steps with `loss.item()`.

    torchrun --nproc_per_node 2 gpt2_ddp.py --layers 4 --embd 512 --seq 256 --batch 16
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from transformers import GPT2Config, GPT2LMHeadModel


class RandomTokens(Dataset):
    def __init__(self, n, seq, vocab, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (n, seq + 1), generator=g)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        row = self.data[i]
        return row[:-1], row[1:]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--embd", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--batch", type=int, default=16, help="per GPU")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--log-every", type=int, default=1)
    p.add_argument("--bf16", action="store_true", help="autocast to bfloat16")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()

    dist.init_process_group("nccl" if args.device == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    if args.device == "cuda":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    torch.manual_seed(0)

    config = GPT2Config(n_layer=args.layers, n_embd=args.embd, n_head=args.heads,
                        n_positions=max(1024, args.seq))
    model = GPT2LMHeadModel(config).to(device)
    model = DDP(model, device_ids=[local_rank] if args.device == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    if rank == 0:
        n = sum(p.numel() for p in model.parameters())
        print(f"GPT-2 {args.layers}x{args.embd}: {n / 1e6:.1f}M parameters, world {world}")

    dataset = RandomTokens(args.batch * world * args.steps, args.seq, config.vocab_size)
    loader = DataLoader(dataset, batch_size=args.batch, sampler=DistributedSampler(dataset, shuffle=True),
                        pin_memory=args.device == "cuda", drop_last=True)
    amp = torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=args.bf16)

    model.train()
    t0 = time.time()
    for step, (x, y) in enumerate(loader):
        x = x.to(device, non_blocking=True)
        y = y.to(device, non_blocking=True)
        with amp:
            logits = model(input_ids=x).logits
            loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.view(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if args.log_every and step % args.log_every == 0:
            dt = time.time() - t0
            t0 = time.time()
            print(f"rank {rank} step {step} loss {loss.item():.4f} ({dt * 1000:.1f} ms)", flush=True)
    if args.device == "cuda":
        torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
