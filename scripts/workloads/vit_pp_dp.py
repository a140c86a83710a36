"""ViT-B/16 image classification with pipeline parallelism (torch.distributed.pipelining,
1F1B) across `--pp` stages and data parallelism (FSDP2, fully_shard) within each stage, on a 2-D DeviceMesh
("pp", "dp"): rank = stage * dp + dp_index.

The training set mixes two sources round-robin (sample i comes from source i % 2): a curated
set stored pre-resized at 256x256 and a web-crawled set of full-size photos. The first stage
decodes and augments images in a DataLoader (2 workers); the last stage only needs the labels
and reads them from the same index order. The DistributedSampler keeps the stored order
(shuffle=False) so that every stage of a pipeline sees the same samples.
`--slow-loader-rank R` gives first-stage rank R's DataLoader fewer workers (`--slow-loader-workers`).
One NVTX range `step N` per training step.

    torchrun --nproc_per_node 4 vit_pp_dp.py --pp 2 --dp 2 --batch 64 --microbatches 4
"""

import argparse
import io
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
import torchvision.transforms as T
from PIL import Image
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from torchvision.models import vit_b_16

NORMALIZE = T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])


def encode(rng, h, w):
    small = rng.integers(0, 256, (max(h // 8, 1), max(w // 8, 1), 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(small).resize((w, h), Image.BILINEAR).save(buf, format="JPEG", quality=92)
    return buf.getvalue()


class MixedImageSet(Dataset):
    def __init__(self, n, classes, crop=224, curated_size=256, web_size=(480, 640)):
        rng = np.random.default_rng(0)
        self.sources = [[encode(rng, curated_size, curated_size) for _ in range(8)],
                        [encode(rng, *web_size) for _ in range(8)]]
        self.transforms = [T.Compose([T.RandomCrop(crop), T.RandomHorizontalFlip(), T.ToTensor(), NORMALIZE]),
                           T.Compose([T.RandomResizedCrop(crop), T.RandomHorizontalFlip(), T.ToTensor(), NORMALIZE])]
        self.targets = rng.integers(0, classes, n).tolist()

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        src = i % len(self.sources)
        pool = self.sources[src]
        img = Image.open(io.BytesIO(pool[(i // len(self.sources)) % len(pool)])).convert("RGB")
        return self.transforms[src](img), self.targets[i]


class Labels(Dataset):
    def __init__(self, targets):
        self.targets = targets

    def __len__(self):
        return len(self.targets)

    def __getitem__(self, i):
        return self.targets[i]


class ViTStage(nn.Module):
    """Encoder blocks [lo, hi) of a torchvision ViT; the first stage also patchifies and embeds,
    the last one applies the final norm and the classification head."""

    def __init__(self, vit, lo, hi, first, last):
        super().__init__()
        self.vit_first = first
        if first:
            self.conv_proj, self.class_token = vit.conv_proj, vit.class_token
            self.pos_embedding, self.dropout = vit.encoder.pos_embedding, vit.encoder.dropout
            self.patch_size, self.hidden_dim = vit.patch_size, vit.hidden_dim
        self.layers = nn.Sequential(*vit.encoder.layers[lo:hi])
        self.ln = vit.encoder.ln if last else None
        self.heads = vit.heads if last else None

    def forward(self, x):
        if self.vit_first:
            n = x.shape[0]
            x = self.conv_proj(x).reshape(n, self.hidden_dim, -1).permute(0, 2, 1)
            x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
            x = self.dropout(x + self.pos_embedding)
        x = self.layers(x)
        if self.heads is not None:
            return self.heads(self.ln(x)[:, 0])
        return x.contiguous()  # sent to the next stage: NCCL and gloo need a dense buffer


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--batch", type=int, default=64, help="per data-parallel replica")
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--schedule", choices=("gpipe", "1f1b"), default="1f1b")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--stage-blocks", default="", help="encoder blocks per stage, e.g. 4,8 (default: even)")
    p.add_argument("--slow-loader-rank", type=int, default=-1,
                   help="this first-stage rank's DataLoader has --slow-loader-workers workers (fewer cores)")
    p.add_argument("--slow-loader-workers", type=int, default=1)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()

    if args.device == "cuda":
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    mesh = init_device_mesh(args.device, (args.pp, args.dp), mesh_dim_names=("pp", "dp"))
    stage_idx, dp_idx = mesh.get_local_rank("pp"), mesh.get_local_rank("dp")
    first, last = stage_idx == 0, stage_idx == args.pp - 1
    rank = dist.get_rank()

    torch.manual_seed(0)  # same initial weights on every data-parallel replica
    vit = vit_b_16(image_size=args.image_size, num_classes=args.classes)
    n_blocks = len(vit.encoder.layers)
    blocks = [int(b) for b in args.stage_blocks.split(",")] if args.stage_blocks else [n_blocks // args.pp] * args.pp
    if len(blocks) != args.pp or sum(blocks) != n_blocks:
        p.error(f"--stage-blocks: {args.pp} counts adding up to {n_blocks}")
    lo = sum(blocks[:stage_idx])
    hi = lo + blocks[stage_idx]
    model = ViTStage(vit, lo, hi, first, last).to(device)
    del vit
    # Data parallel within the stage: FSDP2 over the "dp" mesh dimension (DDP inside a
    # PipelineStage trips a reducer assertion in torch 2.13 on its first step).
    for block in model.layers:
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    stage = PipelineStage(model, stage_idx, args.pp, device, group=mesh.get_group("pp"))
    sched_cls = Schedule1F1B if args.schedule == "1f1b" else ScheduleGPipe
    schedule = sched_cls(stage, n_microbatches=args.microbatches,
                         loss_fn=lambda logits, y: F.cross_entropy(logits, y))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    dataset = MixedImageSet(args.batch * args.dp * args.steps, args.classes, crop=args.image_size)
    sampler = DistributedSampler(dataset, num_replicas=args.dp, rank=dp_idx, shuffle=False)
    if first:
        workers = args.slow_loader_workers if rank == args.slow_loader_rank else args.workers
        loader = DataLoader(dataset, batch_size=args.batch, sampler=sampler, num_workers=workers,
                            pin_memory=args.device == "cuda", drop_last=True)
    else:
        loader = DataLoader(Labels(dataset.targets), batch_size=args.batch, sampler=sampler, drop_last=True)
    print(f"rank {rank}: stage {stage_idx} dp {dp_idx}, blocks {lo}..{hi - 1}", flush=True)

    t0 = time.perf_counter()
    for step, batch in enumerate(loader):
        with torch.cuda.nvtx.range(f"step {step}"):
            optimizer.zero_grad(set_to_none=True)
            if first:
                images, _ = batch
                schedule.step(images.to(device, non_blocking=True))
            elif last:
                losses = []
                schedule.step(target=batch.to(device, non_blocking=True), losses=losses)
            else:
                schedule.step()
            optimizer.step()
        if last and dp_idx == 0:
            loss = torch.stack(losses).mean().item()
            print(f"step {step} loss {loss:.3f} {1000 * (time.perf_counter() - t0):.0f} ms", flush=True)
            t0 = time.perf_counter()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
