"""Communication benchmark with known message sizes: the ground truth for orch's
bytes and bandwidth per collective.

Modes:
  sweep  every step: all-reduce fp32 (4 KiB .. 1 GiB) and bf16, all-gather, reduce-scatter,
         broadcast and send/recv (both directions) of fixed sizes, each in an NVTX range named
         after what it sends ("all_reduce fp32 4096B"); step 0 is warm-up. After the steps an
         nccl-tests-style timing (CUDA events around back-to-back all-reduces, outside every
         step) gives an independent bus bandwidth per size.
  ddp    DDP of an MLP with a known bucket_cap_mb; the bucket sizes DDP chose are recorded.

Every rank writes what it sent to <out>/truth_r<RANK>.json (op, dtype, elements, bytes per
rank, group size), so a test can compare orch's numbers with an independent computation.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

KIB = 1024
MIB = 1024 * KIB

# (op, dtype, bytes per rank): for all_gather the input of one rank, for reduce_scatter the
# output of one rank (NCCL's own convention for its "Message size"); send/recv both ways.
SWEEP = (
    [("all_reduce", "fp32", b) for b in (4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB,
                                         16 * MIB, 64 * MIB, 256 * MIB, 1024 * MIB)]
    + [("all_reduce", "bf16", b) for b in (4 * KIB, 256 * KIB, 16 * MIB, 256 * MIB, 1024 * MIB)]
    + [("all_gather", "fp32", b) for b in (MIB, 16 * MIB, 128 * MIB)]
    + [("reduce_scatter", "fp32", b) for b in (MIB, 16 * MIB, 128 * MIB)]
    + [("broadcast", "fp32", 64 * MIB)]
    + [("send_recv", "fp32", b) for b in (MIB, 16 * MIB, 256 * MIB)]
)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def nvtx(dev: torch.device):
    """NVTX push/pop (a no-op on CPU builds without NVTX)."""
    if dev.type == "cuda":
        return torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
    return (lambda _m: None), (lambda: None)


def run_op(op: str, t: torch.Tensor, out: torch.Tensor | None, rank: int, world: int) -> list[dict]:
    """One operation; returns what it sent, one entry per NCCL call (send_recv: two)."""
    nbytes = t.numel() * t.element_size()
    if op == "all_reduce":
        dist.all_reduce(t)
    elif op == "all_gather":
        dist.all_gather_into_tensor(out, t)
    elif op == "reduce_scatter":
        dist.reduce_scatter_tensor(out, t)
        nbytes = out.numel() * out.element_size()
    elif op == "broadcast":
        dist.broadcast(t, src=0)
    elif op == "send_recv":  # 0 -> 1, then 1 -> 0 (a 2-rank job)
        sent = []
        for src in (0, 1):
            if rank == src:
                dist.send(t, dst=1 - src)
                sent.append({"call": "send", "peer": 1 - src})
            else:
                dist.recv(t, src=src)
                sent.append({"call": "recv", "peer": src})
        return [dict(s, bytes=nbytes) for s in sent]
    return [{"call": op, "bytes": nbytes}]


def sweep(args, dev: torch.device, rank: int, world: int) -> dict:
    push, pop = nvtx(dev)
    bufs = {}
    for op, dt, b in SWEEP:
        el = DTYPES[dt]
        n = max(1, (b // args.scale) // torch.tensor([], dtype=el).element_size())
        if op == "all_gather":
            bufs[(op, dt, b)] = (torch.ones(n, dtype=el, device=dev), torch.empty(n * world, dtype=el, device=dev))
        elif op == "reduce_scatter":
            bufs[(op, dt, b)] = (torch.ones(n * world, dtype=el, device=dev), torch.empty(n, dtype=el, device=dev))
        else:
            bufs[(op, dt, b)] = (torch.ones(n, dtype=el, device=dev), None)
    calls = []
    for step in range(args.steps):
        push(f"step {step}")
        for op, dt, b in SWEEP:
            if dev.type == "cpu" and op == "reduce_scatter":
                continue  # gloo has no reduce_scatter (CPU rehearsal only)
            t, out = bufs[(op, dt, b)]
            nbytes = (out if op == "reduce_scatter" else t).numel() * t.element_size()
            push(f"{op} {dt} {nbytes}B")
            for c in run_op(op, t, out, rank, world):
                calls.append(dict(c, step=step, op=op, dtype=dt, elements=t.numel() if op != "reduce_scatter"
                                  else out.numel(), group_size=world))
            pop()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        pop()
    return {"calls": calls, "nccl_tests": nccl_tests(args, dev, world) if dev.type == "cuda" else []}


def nccl_tests(args, dev: torch.device, world: int) -> list[dict]:
    """nccl-tests style: back-to-back all-reduces timed with CUDA events, no profiler logic."""
    out = []
    for dt in ("fp32",):
        for op, d, b in SWEEP:
            if op != "all_reduce" or d != dt:
                continue
            t = torch.ones(b // args.scale // 4, dtype=torch.float32, device=dev)
            dist.barrier()
            dist.all_reduce(t)
            torch.cuda.synchronize()
            iters = 5 if b >= 64 * MIB else 20
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(iters):
                dist.all_reduce(t)
            e.record()
            torch.cuda.synchronize()
            sec = s.elapsed_time(e) / 1e3 / iters
            nbytes = t.numel() * 4
            algbw = nbytes / sec / 1e9
            out.append({"op": "all_reduce", "dtype": dt, "bytes": nbytes, "time_us": sec * 1e6,
                        "algbw_GBps": algbw, "busbw_GBps": algbw * 2 * (world - 1) / world})
    return out


def ddp(args, dev: torch.device, rank: int, world: int) -> dict:
    from torch.nn.parallel import DistributedDataParallel as DDP

    push, pop = nvtx(dev)
    torch.manual_seed(0)
    width = args.width
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(args.layers)]).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    ddp_model = DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None,
                    bucket_cap_mb=args.bucket_cap_mb)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=1e-3)
    x = torch.randn(args.batch, width, device=dev)
    for step in range(args.steps):
        push(f"step {step}")
        loss = ddp_model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=False)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        pop()
    data = ddp_model._get_ddp_logging_data()
    sizes = data.get("bucket_sizes", "")
    try:  # the reducer's buckets after the rebuild of the first iteration (what is all-reduced)
        grads = ddp_model.reducer._get_zeros_like_grad_buckets()
        buckets = [b.buffer().numel() * b.buffer().element_size() for b in grads]
    except Exception as e:
        buckets = [f"unavailable: {e}"]
    return {"params": n_params, "param_bytes": n_params * 4, "bucket_cap_mb": args.bucket_cap_mb,
            "bucket_sizes_logged": [int(s) for s in str(sizes).replace(" ", "").split(",") if s],
            "reducer_bucket_bytes": buckets,
            "steps": args.steps, "width": width, "layers": args.layers}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["sweep", "ddp"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--scale", type=int, default=1, help="divide every size (CPU rehearsal)")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--bucket-cap-mb", type=float, default=8.0)
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=dev if cuda else None)
    t0 = time.time()
    res = sweep(args, dev, rank, world) if args.mode == "sweep" else ddp(args, dev, rank, world)
    env = {k: os.environ.get(k) for k in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_IB_DISABLE",
                                          "NCCL_SOCKET_IFNAME", "NCCL_NVLS_ENABLE")}
    res.update(mode=args.mode, rank=rank, world=world, seconds=time.time() - t0, env=env,
               torch=torch.__version__,
               nccl=".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
               gpu=torch.cuda.get_device_name(dev) if cuda else None)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"truth_r{rank}.json"), "w") as f:
        json.dump(res, f, indent=1)
    if rank == 0 and res.get("nccl_tests"):
        for r in res["nccl_tests"]:
            print(f"nccl-tests-style all_reduce {r['bytes']:>12} B  {r['time_us']:10.1f} us  "
                  f"busbw {r['busbw_GBps']:7.1f} GB/s")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
