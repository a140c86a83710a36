"""ResNet-50 DDP trainer, ported from the Slurm + torchrun + Nsight Systems tutorial
(seed 003, section 2.1.1): NVTX ranges `Entire training`, `Training Epoch E`,
`Epoch E Start`, `Step S Start` (S restarts at 0 every epoch) and the per-phase ranges of
`_run_batch`. The batch is fetched by the `for step, (source, targets) in
enumerate(self.train_data)` line, before the step range opens.

Changes from the tutorial, so that it runs here: the synthetic dataset decodes and augments
JPEG images (the usual ImageNet training transforms) instead of returning torch.randn, its
length is a flag, `pretrained=False` became `weights=None` (torchvision >= 0.13), the
cudaProfilerApi start/stop calls are gone (the capture is not range-limited), and
`--device cpu` runs it on gloo for a smoke test.

    torchrun --nproc_per_node 2 resnet_ddp.py 2 128 --num-workers 2
"""

import io
import os
import random

import numpy as np
import torch
import torch.cuda.nvtx as nvtx
import torch.distributed as dist
import torch.nn.functional as F
import torchvision.transforms as T
from PIL import Image
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler
from torchvision import models

DEVICE = "cuda"


def ddp_setup():
    init_process_group(backend="nccl" if DEVICE == "cuda" else "gloo")
    if DEVICE == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    world_size = dist.get_world_size()
    rank = dist.get_rank()
    return world_size, rank


class Trainer:
    def __init__(self, model: torch.nn.Module, train_data: DataLoader, optimizer: torch.optim.Optimizer) -> None:
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
        self.device = self.local_rank if DEVICE == "cuda" else "cpu"
        self.model = model.to(self.device)
        self.train_data = train_data
        self.optimizer = optimizer
        self.model = DDP(self.model, device_ids=[self.local_rank] if DEVICE == "cuda" else None)

    def _run_batch(self, source, targets):
        nvtx.range_push("Optimizer Zero Grad")
        self.optimizer.zero_grad()
        nvtx.range_pop()
        nvtx.range_push("Forward Pass")
        output = self.model(source)
        nvtx.range_pop()
        nvtx.range_push("Loss Computation")
        loss = F.cross_entropy(output, targets)
        nvtx.range_pop()
        nvtx.range_push("Backward Pass")
        loss.backward()
        nvtx.range_pop()
        nvtx.range_push("Optimizer Step")
        self.optimizer.step()
        nvtx.range_pop()

    def _run_epoch(self, epoch):
        print(f"[GPU{self.global_rank}] Epoch {epoch} | Steps: {len(self.train_data)}")
        self.train_data.sampler.set_epoch(epoch)
        nvtx.range_push(f"Epoch {epoch} Start")
        for step, (source, targets) in enumerate(self.train_data):
            nvtx.range_push(f"Step {step} Start")
            source = source.to(self.device)
            targets = targets.to(self.device)
            self._run_batch(source, targets)
            nvtx.range_pop()  # Step end
        nvtx.range_pop()

    def train(self, max_epochs: int):
        nvtx.range_push("Entire training ")
        for epoch in range(max_epochs):
            nvtx.range_push(f"Training Epoch {epoch}")
            self._run_epoch(epoch)
            nvtx.range_pop()
        nvtx.range_pop()


class SyntheticDataset(Dataset):
    """ImageNet-style samples: a JPEG (375x500, like the median ImageNet photo) decoded and
    augmented per sample, with a random label."""

    def __init__(self, num_epochs, batch_size_per_gpu, world_size, length=10000, crop=224):
        self.num_epochs = num_epochs
        self.batch_size_per_gpu = batch_size_per_gpu
        self.num_iters = world_size
        self.len = length
        rng = np.random.default_rng(0)
        self.jpegs = []
        for _ in range(16):  # a small pool of distinct encoded photos
            small = rng.integers(0, 256, (47, 63, 3), dtype=np.uint8)
            img = Image.fromarray(small).resize((500, 375), Image.BILINEAR)
            buf = io.BytesIO()
            img.save(buf, format="JPEG", quality=90)
            self.jpegs.append(buf.getvalue())
        self.transform = T.Compose([
            T.RandomResizedCrop(crop),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]),
        ])

    def __getitem__(self, idx):
        img = Image.open(io.BytesIO(self.jpegs[idx % len(self.jpegs)])).convert("RGB")
        data = self.transform(img)
        target = random.randint(0, 999)
        return (data, target)

    def __len__(self):
        return self.len


def load_train_objs(num_epochs, batch_size_per_gpu, world_size, length, crop):
    train_set = SyntheticDataset(num_epochs, batch_size_per_gpu, world_size, length, crop)
    model = models.resnet50(weights=None)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int, num_workers: int):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=DEVICE == "cuda",
        shuffle=False,
        sampler=DistributedSampler(dataset),
        num_workers=num_workers,
    )


def main(total_epochs: int, batch_size: int, num_workers: int, length: int, crop: int):
    world_size, _rank = ddp_setup()
    batch_size_per_gpu = batch_size // world_size
    dataset, model, optimizer = load_train_objs(total_epochs, batch_size_per_gpu, world_size, length, crop)
    train_data = prepare_dataloader(dataset, batch_size_per_gpu, num_workers)
    trainer = Trainer(model, train_data, optimizer)
    trainer.train(total_epochs)
    print('Will now destroy the process group\n')
    destroy_process_group()
    print('Process group destroyed')
    import sys
    sys.exit(0)


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description='simple distributed training job')
    parser.add_argument('total_epochs', type=int, help='Total epochs to train the model')
    parser.add_argument('batch_size', default=32, type=int, help='Input batch size on each device (default: 32)')
    parser.add_argument('--num-workers', type=int, default=2, help='DataLoader worker processes')
    parser.add_argument('--samples', type=int, default=10000, help='dataset length')
    parser.add_argument('--crop', type=int, default=224, help='training crop size')
    parser.add_argument('--device', choices=('cuda', 'cpu'), default='cuda' if torch.cuda.is_available() else 'cpu')
    args = parser.parse_args()
    DEVICE = args.device
    main(args.total_epochs, args.batch_size, args.num_workers, args.samples, args.crop)
