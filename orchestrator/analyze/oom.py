"""What a rank that ran out of GPU memory held, for the outcome: from nsys' allocation events
(`mem_peak`, metrics/sql/63_gpu_memory.sql) and from torch's own message (submit/evidence.py:
`torch_oom`).

The two say different things and both are needed. The events are what the capture saw the
process allocate, up to the failure, on the rank's own GPU; they never hold the allocation that
failed (cudaMalloc returned an error) nor the CUDA context. torch's message says what that
allocation asked for, what PyTorch had allocated and reserved, what the whole process and the
other processes on the GPU held, and what was left free.
"""

from __future__ import annotations

import re

from orchestrator.metrics.engine import Views

_SIZE = r"([\d.]+ [KMGTP]?i?B)"
# torch 2.x: `Tried to allocate 1.53 GiB. GPU 0 has a total capacity of 139.80 GiB of which 1.52 GiB
# is free. Including non-PyTorch memory, this process has 133.20 GiB memory in use. Process 13068
# has 5.07 GiB memory in use. Of the allocated memory 130.80 GiB is allocated by PyTorch, and
# 823.58 MiB is reserved by PyTorch but unallocated.`
_ASKED = re.compile(rf"Tried to allocate {_SIZE}")
_CAPACITY = re.compile(rf"total capacity of {_SIZE} of which {_SIZE} is free")
_PROCESS = re.compile(rf"this process has {_SIZE} memory in use")
_OTHER = re.compile(rf"Process \d+ has {_SIZE} memory in use")
_TORCH = re.compile(rf"{_SIZE} is allocated by PyTorch")
_RESERVED = re.compile(rf"{_SIZE} is reserved by PyTorch but unallocated")
# torch 1.x: `Tried to allocate 20.00 MiB (GPU 0; 15.78 GiB total capacity; 14.56 GiB already
# allocated; 3.44 MiB free; 14.69 GiB reserved in total by PyTorch)`
_OLD = re.compile(rf"{_SIZE} total capacity; {_SIZE} already allocated; {_SIZE} free; {_SIZE} reserved")


def torch_words(message: str) -> str:
    """torch's message in words beside the events: what was asked and what was held; the message
    itself where it has none of the parts torch writes."""
    asked = _ASKED.search(message)
    if not asked:
        return f"torch: {message}"
    inside = [f"{m[1]} allocated by PyTorch" for m in [_TORCH.search(message)] if m]
    inside += [f"{m[1]} reserved but unallocated" for m in [_RESERVED.search(message)] if m]
    process = _PROCESS.search(message)
    held = [f"the process held {process[1]}" + (f" ({', '.join(inside)})" if inside else "")] if process else inside
    others = _OTHER.findall(message)
    if others:
        held.append(f"other processes on the GPU {', '.join(others)}")
    if m := _CAPACITY.search(message):
        held.append(f"{m[2]} of the GPU's {m[1]} was free")
    if m := _OLD.search(message):
        held += [f"PyTorch had allocated {m[2]} and reserved {m[4]}", f"{m[3]} of the GPU's {m[1]} was free"]
    return f"torch: the failing allocation asked for {asked[1]}" + (f" while {', '.join(held)}" if held else "")


def at_failure(v: Views, rank: int, message: str | None) -> str:
    """How much GPU memory the rank that ran out held at its highest (every allocation up to the
    failure), in which step, what the other ranks held at that moment (mem_peak, on each rank's
    own GPU), and torch's message beside it."""
    said = f"; {torch_words(message)}" if message else ""
    peak = v.by_rank("mem_peak").get(rank)
    if peak is None:
        return f"rank {rank}'s GPU memory was not traced (profile.cuda_memory_usage: true records it){said}"
    cap = v.by_rank("mem_rank").get(rank, {}).get("capacity")
    others = ", ".join(f"rank {o['rank']} {o['bytes'] / 2**30:.2f} GiB" for o in peak["others"][:8])
    return (f"rank {rank} held {peak['peak_bytes'] / 2**30:.2f} GiB"
            + (f" of its GPU's {cap / 2**30:.1f} GiB" if cap else "")
            + (f" at its highest, in step {peak['step']}" if peak["step"] is not None else " at its highest")
            + " (its allocation events)"
            + (f"; the others then: {others}" if others else "") + said)
