"""ViT-B/16 image classification with DDP and bf16 autocast. Every step is an NVTX range
`step N`. As usual, only the main process does the bookkeeping: after each step it
computes the batch metrics on the CPU (accuracy, top-5, a confusion matrix, calibration
error) and appends them to a JSON-lines log, and every `--eval-every` steps it evaluates
the model on a held-out set.

    torchrun --nproc_per_node 2 vit_ddp_eval.py --batch 64 --steps 14
"""

import argparse
import json
import os
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from torchvision.models import vit_b_16

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
STD = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255


class RandomImages(Dataset):
    """uint8 CHW images and labels, generated per index (stands in for a decoded, cached set)."""

    def __init__(self, n, size, classes, seed):
        self.n, self.size, self.classes, self.seed = n, size, classes, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        img = torch.randint(0, 256, (3, self.size, self.size), dtype=torch.uint8, generator=g)
        return img, int(torch.randint(0, self.classes, (1,), generator=g))


def to_input(images, device):
    x = images.to(device, non_blocking=True).float()
    return (x - MEAN.to(device)) / STD.to(device)


def batch_metrics(logits, labels, classes):
    probs = logits.float().softmax(-1).cpu().numpy()
    y = labels.cpu().numpy()
    pred = probs.argmax(1)
    top5 = np.argsort(-probs, axis=1)[:, :5]
    conf = np.bincount(y * classes + pred, minlength=classes * classes).reshape(classes, classes)
    confidence = probs.max(1)
    bins = np.minimum((confidence * 15).astype(int), 14)
    ece = sum(abs((pred[bins == b] == y[bins == b]).mean() - confidence[bins == b].mean()) * (bins == b).mean()
              for b in range(15) if (bins == b).any())
    return {"acc": float((pred == y).mean()), "top5": float((top5 == y[:, None]).any(1).mean()),
            "ece": float(ece), "per_class_recall": (conf.diagonal() / np.maximum(conf.sum(1), 1)).round(4).tolist()}


@torch.no_grad()
def evaluate(model, loader, device, amp):
    model.eval()
    correct = total = 0
    loss_sum = 0.0
    for images, labels in loader:
        labels = labels.to(device)
        with amp:
            logits = model(to_input(images, device))
        loss_sum += F.cross_entropy(logits.float(), labels, reduction="sum").item()
        correct += (logits.argmax(-1) == labels).sum().item()
        total += labels.numel()
    model.train()
    return {"val_loss": loss_sum / total, "val_acc": correct / total}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", type=int, default=64, help="per GPU")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--steps", type=int, default=14)
    p.add_argument("--eval-every", type=int, default=4)
    p.add_argument("--eval-batches", type=int, default=6)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--log", default=os.path.join(tempfile.gettempdir(), "vit_metrics.jsonl"))
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
    amp = torch.autocast(device_type=args.device, dtype=torch.bfloat16)

    model = vit_b_16(image_size=args.image_size, num_classes=args.classes).to(device)
    model = DDP(model, device_ids=[local_rank] if args.device == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)

    train_set = RandomImages(args.batch * world * args.steps, args.image_size, args.classes, seed=1)
    loader = DataLoader(train_set, batch_size=args.batch, sampler=DistributedSampler(train_set),
                        num_workers=args.workers, pin_memory=args.device == "cuda", drop_last=True)
    val_loader = None
    if rank == 0:
        val_set = RandomImages(args.batch * args.eval_batches, args.image_size, args.classes, seed=2)
        val_loader = DataLoader(val_set, batch_size=args.batch, num_workers=0)
        log = open(args.log, "w")  # noqa: SIM115 (closed after the loop)

    for step, (images, labels) in enumerate(loader):
        t0 = time.perf_counter()
        with torch.cuda.nvtx.range(f"step {step}"):
            labels = labels.to(device, non_blocking=True)
            with amp:
                logits = model(to_input(images, device))
                loss = F.cross_entropy(logits.float(), labels)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if rank == 0:
            record = {"step": step, "loss": loss.item(), **batch_metrics(logits.detach(), labels, args.classes),
                      "step_ms": 1000 * (time.perf_counter() - t0)}
            if args.eval_every and step % args.eval_every == 0:
                record.update(evaluate(model.module, val_loader, device, amp))
                print(f"step {step} loss {record['loss']:.3f} val_acc {record['val_acc']:.3f}", flush=True)
            log.write(json.dumps(record) + "\n")
            log.flush()
    if rank == 0:
        log.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
