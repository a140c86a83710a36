"""Single-GPU training loops the way current code writes them, for profiling.

One script, several everyday variants (each a flag a user would plausibly have in a train.py):

    python modern_loops.py --model gpt --compile reduce-overhead     # torch.compile + CUDA graphs
    python modern_loops.py --model gpt                               # the same model, eager
    python modern_loops.py --model gpt --empty-cache                 # empty_cache() after every step
    python modern_loops.py --model gpt --keep-outputs                # logits kept for "later metrics"
    python modern_loops.py --model gpt --accum 4 --steps 20          # gradient accumulation
    python modern_loops.py --model resnet --no-pin                   # images from pageable memory
    python modern_loops.py --model gpt --nvtx                        # an NVTX range per step
    python modern_loops.py --model gpt --sample-ms 15 --workers 0    # each sample tokenised in Python
    python modern_loops.py --model resnet --sample-ms 0.75 --workers 2  # each image decoded in Python
    python modern_loops.py --model gpt --fused --accum 4             # fused AdamW, 4 micro-batches a step
    python modern_loops.py --model gpt --mask                        # BERT-style masking in the loop thread
    python modern_loops.py --model gpt --cuda-graph                  # the eager step captured whole in one CUDA graph
    python modern_loops.py --model gpt --ckpt-every 5                # a checkpoint (model + AdamW) every 5 steps
    python modern_loops.py --compile reduce-overhead --min-seq 32    # documents of 32-256 tokens, padded per batch
    python modern_loops.py --compile reduce-overhead --min-seq 32 --pad-to 128  # ... to a multiple of 128
    python modern_loops.py --compile default --graph-break           # a graph break in every block

The model is a small GPT (pre-LN blocks, scaled_dot_product_attention, AdamW) or a torchvision
ResNet-18 (SGD + momentum) on synthetic data held in host memory. `--repeat N` runs the whole
loop N times in one process and prints the steady step time of each run (no profiler needed);
`--step-ms` prints each step's time too.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import random
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Block(nn.Module):
    # A graph break in every block's forward (--graph-break), as a call torch.compile cannot trace
    # makes one (a print, a logging or debugging helper): the block's compiled code ends there and
    # Python runs the rest of the block as its own compiled graph.
    graph_break = False

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        if self.graph_break:
            torch._dynamo.graph_break()
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class Tokens(Dataset):
    """Token windows; `sample_ms` > 0: each sample first spends that long in Python, as a dataset
    that tokenises its text in __getitem__ does (a pure-Python loop, holding the GIL)."""

    def __init__(self, n: int, seq: int, vocab: int, sample_ms: float = 0.0):
        self.data = torch.randint(0, vocab, (n, seq + 1), generator=torch.Generator().manual_seed(0))
        self.sample_ms = sample_ms

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sample_ms > 0:
            tokenise(self.sample_ms)
        return self.data[i, :-1], self.data[i, 1:]


def tokenise(ms: float) -> int:
    """`ms` of Python work, a tokenizer's stand-in: byte-pair merges counted over a string."""
    end, n = time.perf_counter() + ms / 1e3, 0
    text = "the quick brown fox jumps over the lazy dog " * 4
    while time.perf_counter() < end:
        pairs: dict[str, int] = {}
        for a, b in itertools.pairwise(text):
            pairs[a + b] = pairs.get(a + b, 0) + 1
        n += len(pairs)
    return n


def mask_tokens(x: torch.Tensor, vocab: int, rng: random.Random, p: float = 0.15) -> torch.Tensor:
    """BERT's masking (of the chosen 15 %: 80 % mask token, 10 % a random one, 10 % kept), written
    the quick way in the training loop: Python over every token of the batch."""
    rows = x.tolist()
    for row in rows:
        for j in range(len(row)):
            if rng.random() < p:
                r = rng.random()
                if r < 0.8:
                    row[j] = 0
                elif r < 0.9:
                    row[j] = rng.randrange(vocab)
    return torch.tensor(rows, dtype=x.dtype)


class Documents(Tokens):
    """Token windows of `min_seq` to `seq` tokens each (documents of varied length, as a text
    dataset without packing yields them); `pad` pads a batch to its longest, as Hugging Face's
    DataCollatorWithPadding does, rounded up to a multiple of `pad_to` (its pad_to_multiple_of)."""

    def __init__(self, n: int, seq: int, vocab: int, min_seq: int, sample_ms: float = 0.0):
        super().__init__(n, seq, vocab, sample_ms)
        g = torch.Generator().manual_seed(1)
        self.lengths = torch.randint(min_seq, seq + 1, (n,), generator=g).tolist()

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = super().__getitem__(i)
        return x[: self.lengths[i]], y[: self.lengths[i]]


def pad(batch: list[tuple[torch.Tensor, torch.Tensor]], pad_to: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of (tokens, targets) of varied lengths padded to the longest, rounded up to a
    multiple of `pad_to` (at most `seq`); padded targets are -100, which the loss ignores."""
    longest = max(len(x) for x, _ in batch)
    t = min(seq, -(-longest // pad_to) * pad_to)
    xs = torch.zeros(len(batch), t, dtype=torch.long)
    ys = torch.full((len(batch), t), -100, dtype=torch.long)
    for i, (x, y) in enumerate(batch):
        xs[i, : len(x)], ys[i, : len(y)] = x, y
    return xs, ys


class Images(Dataset):
    """Decoded, normalised float images (as a pre-processed dataset cache would hold them);
    `sample_ms` > 0: each image first spends that long in Python, as a dataset that decodes and
    augments its JPEGs in __getitem__ does (PIL's transforms, holding the GIL)."""

    def __init__(self, n: int, size: int, classes: int, sample_ms: float = 0.0):
        g = torch.Generator().manual_seed(0)
        self.pool = torch.randn(64, 3, size, size, generator=g)
        self.labels = torch.randint(0, classes, (n,), generator=g)
        self.sample_ms = sample_ms

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sample_ms > 0:
            tokenise(self.sample_ms)
        return self.pool[i % len(self.pool)].clone(), self.labels[i]


def build(args: argparse.Namespace, device: torch.device):
    if args.model == "gpt":
        model = GPT(args.vocab, args.dim, args.layers, args.heads, args.seq).to(device)
        opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=args.fused or None,
                                capturable=args.cuda_graph)
        n = args.batch * args.accum * (args.epoch_steps or args.steps + 1)
        data = Documents(n, args.seq, args.vocab, args.min_seq, args.sample_ms) if args.min_seq else \
            Tokens(n, args.seq, args.vocab, args.sample_ms)
    else:
        import torchvision

        model = torchvision.models.resnet18(num_classes=args.classes).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        data = Images(args.batch * args.accum * (args.epoch_steps or args.steps + 1), args.image_size, args.classes,
                      args.sample_ms)
    collate = functools.partial(pad, pad_to=args.pad_to, seq=args.seq) if args.min_seq else None
    loader = DataLoader(data, batch_size=args.batch, shuffle=True, drop_last=True, collate_fn=collate,
                        num_workers=args.workers, pin_memory=not args.no_pin,
                        persistent_workers=args.workers > 0 and not args.no_persistent)
    return model, opt, loader


def epochs(loader: DataLoader):
    """Batches epoch after epoch, as `for epoch in range(E): for x, y in loader:` takes them: each
    epoch iterates the loader anew, which starts its workers again unless they are persistent."""
    while True:
        yield from loader


def loss_of(model, args, x, y):
    if args.model == "gpt":
        return model(x, y)
    logits = model(x)
    return logits, F.cross_entropy(logits, y)


def graphed_step(args: argparse.Namespace, model, opt, sample, device: torch.device):
    """The whole eager step (forward, backward, clipping, AdamW) captured in one CUDA graph, as
    PyTorch's CUDA-graph docs capture a whole network: warm-up on a side stream, then capture with
    the gradients unset so that backward allocates them from the graph's pool. The same kernels
    as the eager loop (nothing fused): a replay saves only their launches."""
    static_x, static_y = (t.to(device) for t in sample)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            loss_of(model, args, static_x, static_y)[1].backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        static_loss = loss_of(model, args, static_x, static_y)[1]
        static_loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return graph, static_x, static_y, static_loss


def run_graphed(args: argparse.Namespace, model, opt, loader, device: torch.device) -> float:
    """`run` for --cuda-graph: each step copies its batch into the graph's inputs and replays it."""
    batches = epochs(loader)
    graph, static_x, static_y, static_loss = graphed_step(args, model, opt, next(batches), device)
    t_start = None
    for step in range(args.steps):
        if step == args.warmup:
            torch.cuda.synchronize(device)
            t_start = time.perf_counter()
        rng = torch.cuda.nvtx.range(f"step {step}") if args.nvtx else contextlib.nullcontext()
        with rng:
            x, y = next(batches)
            static_x.copy_(x, non_blocking=True)
            static_y.copy_(y, non_blocking=True)
            graph.replay()
            if step % args.log_every == 0:
                print(f"step {step} loss {static_loss.item():.4f}", flush=True)
    torch.cuda.synchronize(device)
    n = args.steps - args.warmup
    return (time.perf_counter() - t_start) * 1e3 / n if t_start is not None and n > 0 else float("nan")


def save_checkpoint(model: nn.Module, opt: torch.optim.Optimizer, step: int, path: str) -> None:
    """What a resumable loop saves, the way most train.py files do it: the model's and the
    optimizer's state dicts, written synchronously by torch.save from the loop itself."""
    torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}, path)


def run(args: argparse.Namespace, model, opt, loader, device: torch.device) -> float:
    """One pass of `--steps` optimizer steps; returns the mean step time after `--warmup` steps."""
    kept = []  # --keep-outputs: "for metrics at the end of the epoch" (with their autograd graph)
    batches = epochs(loader)
    t_start = None
    mask_rng, masking, saving = random.Random(0), 0.0, 0.0
    ends = []  # --step-ms: when each optimizer step returned, as orch's loop mark `orch: optimizer.step` ends
    for step in range(args.steps):
        if step == args.warmup:
            torch.cuda.synchronize(device) if device.type == "cuda" else None
            t_start, masking, saving = time.perf_counter(), 0.0, 0.0
        rng = torch.cuda.nvtx.range(f"step {step}") if args.nvtx else contextlib.nullcontext()
        with rng:
            for _ in range(args.accum):
                x, y = next(batches)
                if args.mask:
                    t = time.perf_counter()
                    x = mask_tokens(x, args.vocab, mask_rng)
                    masking += time.perf_counter() - t
                x, y = x.to(device, non_blocking=not args.no_pin), y.to(device, non_blocking=not args.no_pin)
                if args.compile:
                    torch.compiler.cudagraph_mark_step_begin()
                logits, loss = loss_of(model, args, x, y)
                (loss / args.accum).backward()
                if args.keep_outputs:
                    kept.append((logits, loss))
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            ends.append(time.perf_counter())
            opt.zero_grad(set_to_none=True)
            if args.empty_cache:
                torch.cuda.empty_cache()
            if args.ckpt_every and (step + 1) % args.ckpt_every == 0:
                t = time.perf_counter()
                save_checkpoint(model, opt, step, args.ckpt_path)
                saving += time.perf_counter() - t
            if step % args.log_every == 0:
                print(f"step {step} loss {loss.item():.4f}", flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    n = args.steps - args.warmup
    if args.mask and n > 0:
        print(f"mask_tokens ms per step: {masking * 1e3 / n:.3f}", flush=True)
    if args.ckpt_every and n > 0:
        print(f"save_checkpoint ms per step: {saving * 1e3 / n:.3f}", flush=True)
    if args.step_ms:
        print("step ms: " + " ".join(f"{(b - a) * 1e3:.3f}" for a, b in itertools.pairwise(ends)), flush=True)
    return (time.perf_counter() - t_start) * 1e3 / n if t_start is not None and n > 0 else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=("gpt", "resnet"), default="gpt")
    p.add_argument("--compile", choices=("reduce-overhead", "default", "max-autotune"), default=None)
    p.add_argument("--steps", type=int, default=40, help="optimizer steps")
    p.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--min-seq", type=int, default=0,
                   help="documents of --min-seq to --seq tokens, each batch padded to its longest (0: all --seq)")
    p.add_argument("--pad-to", type=int, default=1, help="with --min-seq: pad a batch to a multiple of this")
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--dim", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--workers", type=int, default=0, help="DataLoader workers")
    p.add_argument("--sample-ms", type=float, default=0.0,
                   help="Python time per sample (a tokenising or decoding dataset)")
    p.add_argument("--epoch-steps", type=int, default=0,
                   help="optimizer steps an epoch of the dataset holds (0: one epoch holds them all)")
    p.add_argument("--no-persistent", action="store_true",
                   help="DataLoader(persistent_workers=False): the workers start anew every epoch")
    p.add_argument("--fused", action="store_true", help="AdamW(fused=True)")
    p.add_argument("--graph-break", action="store_true", help="with --compile: a graph break in every block")
    p.add_argument("--mask", action="store_true", help="mask_tokens() on every batch in the loop thread")
    p.add_argument("--no-pin", action="store_true", help="DataLoader(pin_memory=False), blocking copies")
    p.add_argument("--empty-cache", action="store_true", help="torch.cuda.empty_cache() after every step")
    p.add_argument("--keep-outputs", action="store_true", help="keep every step's (logits, loss)")
    p.add_argument("--nvtx", action="store_true", help="an NVTX range 'step N' around every step")
    p.add_argument("--cuda-graph", action="store_true",
                   help="capture the whole eager step in one CUDA graph (AdamW capturable); --accum 1 only")
    p.add_argument("--ckpt-every", type=int, default=0, help="save_checkpoint() every N optimizer steps (0: never)")
    p.add_argument("--ckpt-path", default="/tmp/modern_loops_ckpt.pt", help="where --ckpt-every writes")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--step-ms", action="store_true",
                   help="print the ms from each optimizer step's return to the next's (the steps a capture's "
                        "loop marks time), the warm-up steps included")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the printed step time")
    p.add_argument("--repeat", type=int, default=1, help="run the whole loop this many times")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    if args.device == "cpu" and (args.compile == "reduce-overhead" or args.empty_cache or args.cuda_graph):
        # CPU smoke runs: no CUDA graphs, no CUDA cache
        args.compile, args.empty_cache, args.cuda_graph = None, False, False
    if args.cuda_graph and (args.accum != 1 or args.compile or args.model != "gpt"):
        p.error("--cuda-graph captures one eager GPT step: use it with --accum 1, without --compile")
    if args.min_seq and not (args.model == "gpt" and 0 < args.min_seq <= args.seq and args.pad_to >= 1):
        p.error("--min-seq: the GPT only, with 0 < --min-seq <= --seq and --pad-to >= 1")
    if args.graph_break and not (args.compile and args.model == "gpt"):
        p.error("--graph-break: the compiled GPT only (--compile)")
    if args.cuda_graph and args.ckpt_every:
        p.error("--ckpt-every: the eager loop only, not with --cuda-graph")

    device = torch.device(args.device)
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    Block.graph_break = args.graph_break
    model, opt, loader = build(args, device)
    if args.compile:
        model = torch.compile(model, mode=args.compile)
    n = sum(q.numel() for q in model.parameters())
    print(f"{args.model}: {n / 1e6:.1f}M parameters, compile={args.compile}, batch {args.batch} x {args.accum}")
    model.train()
    times = [(run_graphed if args.cuda_graph else run)(args, model, opt, loader, device) for _ in range(args.repeat)]
    print("steady step ms per run: " + " ".join(f"{t:.3f}" for t in times))
    print(f"steady step ms median: {statistics.median(times):.3f}")


if __name__ == "__main__":
    main()
