"""Example workload for orch: data-parallel or 2-stage pipeline training with NVTX phases.

world = dp * pp; rank r is stage r // dp, data-parallel index r % dp (Megatron order, tp=1).
Every step is an NVTX range `step N` holding `data_load`, `forward`, `backward`, `optimizer`
(pipeline mode: `forward mbK` / `backward mbK` per microbatch, with `send_activation`,
`recv_activation`, `send_grad`, `recv_grad`).

Planted faults for the analysis to find:
  --slow-rank R --slow-ms MS   rank R sleeps MS in every data_load (a straggler)
  --heavy-stage S              stage S holds --heavy-factor times more layers
  --fault F --fault-rank R --fault-step N
                               rank R, in step N before its backward (the all-reduce): hangs
                               (F=hang), raises (F=raise) or is SIGKILLed (F=sigkill, as by the OOM killer)
  --uploader                   every rank starts a metrics uploader process that outlives it
                               (as a DataLoader worker blocked in a read does)
  --loader-workers N           batches come from a DataLoader with N persistent (forked) workers,
                               as the tutorials load data: a rank that fails ends slower

Runs on CPU (gloo) or GPU (nccl). NVTX comes from the `nvtx` package (which nsys records on
CPU too) or, failing that, torch.cuda.nvtx on GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn

try:  # PyPI nvtx: works without CUDA (nvtx==0.2.10 is what nsys 2022.4 records).
    import nvtx as _nvtx

    def range_push(msg: str) -> None:
        _nvtx.push_range(msg)

    def range_pop() -> None:
        _nvtx.pop_range()
except ImportError:  # pragma: no cover - depends on the environment
    if torch.cuda.is_available():
        range_push, range_pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
    else:
        def range_push(msg: str) -> None:
            pass

        def range_pop() -> None:
            pass


@contextlib.contextmanager
def nvtx_range(msg: str):
    range_push(msg)
    try:
        yield
    finally:
        range_pop()


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pp", type=int, default=1, choices=(1, 2))
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-ms", type=float, default=0.0)
    p.add_argument("--heavy-stage", type=int, default=-1)
    p.add_argument("--heavy-factor", type=int, default=2)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--microbatches", type=int, default=2)
    p.add_argument("--capture", default="", help="START:STOP steps for cudaProfilerStart/Stop")
    p.add_argument("--fail-rank", type=int, default=-1, help="this rank exits with status 3")
    p.add_argument("--fault", choices=("hang", "raise", "sigkill"), default=None)
    p.add_argument("--fault-rank", type=int, default=-1)
    p.add_argument("--fault-step", type=int, default=0)
    p.add_argument("--uploader", action="store_true", help="start a process that outlives the program")
    p.add_argument("--no-sync", action="store_true",
                   help="do not read the loss every step (lets the CPU run ahead of the GPU)")
    p.add_argument("--loader-workers", type=int, default=0, help="batches from a DataLoader with N workers")
    p.add_argument("--log-every", type=int, default=0, metavar="N",
                   help="print `rank R finished step S` every N steps (no GPU sync: the step's number only)")
    return p.parse_args()


def fault(kind: str, step: int) -> None:
    """The planted fault, inside the step's NVTX range, before its backward's all-reduce."""
    print(f"rank fault: {kind} at step {step}", flush=True)
    if kind == "hang":
        with nvtx_range("hang"):
            while True:
                time.sleep(1)
    if kind == "raise":
        raise RuntimeError(f"planted failure at step {step}")
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    a = parse()
    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if a.uploader:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)", "metrics-uploader"])
    if rank == a.fail_rank:
        raise SystemExit(3)
    if world % a.pp:
        raise SystemExit(f"world size {world} is not a multiple of --pp {a.pp}")
    dp = world // a.pp
    stage = rank // dp
    local = int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        torch.cuda.set_device(local)
    dev = torch.device("cuda", local) if use_cuda else torch.device("cpu")
    dtype = torch.bfloat16 if use_cuda else torch.float32
    torch.manual_seed(0)
    torch.set_num_threads(1)
    groups = [dist.new_group(list(range(s * dp, (s + 1) * dp))) for s in range(a.pp)]

    n_layers = a.layers * (a.heavy_factor if stage == a.heavy_stage else 1)
    net = nn.Sequential(*[nn.Sequential(nn.Linear(a.width, a.width), nn.GELU()) for _ in range(n_layers)])
    net = net.to(dev, dtype)
    model = (nn.parallel.DistributedDataParallel(net, device_ids=[local] if use_cuda else None,
                                                 process_group=groups[stage]) if dp > 1 else net)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    mb = max(1, a.batch // a.microbatches)
    host_batch = torch.randn(mb, a.width, dtype=dtype)
    if use_cuda:
        host_batch = host_batch.pin_memory()
    prev_rank, next_rank = rank - dp, rank + dp
    last_loss = float("nan")
    first, last = stage == 0, stage == a.pp - 1
    cap = [int(x) for x in a.capture.split(":")] if a.capture else None

    def loader_batches() -> Iterator[torch.Tensor]:
        data = torch.utils.data.TensorDataset(torch.randn(mb * 16, a.width, dtype=dtype))
        loader = torch.utils.data.DataLoader(data, batch_size=mb, num_workers=a.loader_workers,
                                             persistent_workers=True, pin_memory=use_cuda)
        while True:
            for (x,) in loader:
                yield x

    batches = loader_batches() if a.loader_workers else None

    def load_batch() -> torch.Tensor:
        with nvtx_range("data_load"):
            if rank == a.slow_rank:
                time.sleep(a.slow_ms / 1e3)
            return (next(batches) if batches else host_batch).to(dev, non_blocking=True)

    for step in range(a.steps):
        if use_cuda and cap and step == cap[0]:
            torch.cuda.cudart().cudaProfilerStart()
            # Starting a capture can take a rank (e.g. the GPU-metrics collector) hundreds of
            # ms: line the ranks up again so the captured steps show the workload, not that.
            torch.cuda.synchronize()
            dist.barrier()
        if use_cuda and cap and step == cap[1]:
            torch.cuda.synchronize()
            torch.cuda.cudart().cudaProfilerStop()
        with nvtx_range(f"step {step}"):
            outs, ins = [], []
            for m in range(a.microbatches):
                with nvtx_range(f"forward mb{m}" if a.pp > 1 else "forward"):
                    if first:
                        x = load_batch()
                    else:
                        x = torch.empty(mb, a.width, dtype=dtype, device=dev)
                        with nvtx_range("recv_activation"):
                            dist.recv(x, prev_rank)
                        x.requires_grad_(True)
                    ins.append(x)
                    y = model(x)
                    if last:
                        y = y.float().pow(2).mean()
                    else:
                        with nvtx_range("send_activation"):
                            dist.send(y.detach().contiguous(), next_rank)
                    outs.append(y)
            if a.fault and rank == a.fault_rank and step == a.fault_step:
                fault(a.fault, step)
            for m in range(a.microbatches):
                no_sync = dp > 1 and m < a.microbatches - 1
                sync = model.no_sync() if no_sync else contextlib.nullcontext()
                with nvtx_range(f"backward mb{m}" if a.pp > 1 else "backward"), sync:
                    if last:
                        outs[m].backward()
                    else:
                        g = torch.empty_like(outs[m])
                        with nvtx_range("recv_grad"):
                            dist.recv(g, next_rank)
                        outs[m].backward(g)
                    if not first:
                        with nvtx_range("send_grad"):
                            dist.send(ins[m].grad.contiguous(), prev_rank)
            with nvtx_range("optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
            if last and not a.no_sync:  # logging the loss syncs with the GPU, as real loops do
                last_loss = sum(float(o.detach()) for o in outs) / len(outs)
        if a.log_every and (step + 1) % a.log_every == 0:
            print(f"rank {rank} finished step {step}", flush=True)
    if use_cuda:
        torch.cuda.synchronize()
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} stage {stage} done, last loss {last_loss:.4g}", flush=True)


if __name__ == "__main__":
    main()
