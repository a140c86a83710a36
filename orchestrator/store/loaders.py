"""Each rank's DataLoader settings, as orch's loop marks wrote them in the job
(templates/orch_loop_marks.py.j2: `dumps/loaders.r<RANK>.jsonl`, a line per loader the rank
iterated): what the fix for a slow input depends on (no workers: the loop thread loads its own
data). A run directory is not trusted input: each file is read to a bound (by
evidence.rank_texts, as the stack dumps are), each line parsed strictly, and what does not parse
is skipped."""

from __future__ import annotations

import json
import re

from pydantic import BaseModel, ConfigDict, ValidationError

LOADERS_BYTES = 64 << 10  # a few loaders a rank; a program that makes one per step repeats itself
MAX_PER_RANK = 8
LOADERS_NAME = re.compile(r"loaders\.r(\d{1,7})\.jsonl")


class LoaderSettings(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)

    num_workers: int | None = None
    pin_memory: bool | None = None
    prefetch_factor: int | None = None
    persistent_workers: bool | None = None
    batch_size: int | None = None
    dataset: str | None = None

    @property
    def line(self) -> str:
        """The settings in the words of the DataLoader's own arguments."""
        parts = [f"num_workers={self.num_workers}", f"pin_memory={self.pin_memory}"]
        if self.num_workers:
            parts += [f"prefetch_factor={self.prefetch_factor}", f"persistent_workers={self.persistent_workers}"]
        if self.batch_size is not None:
            parts.append(f"batch_size={self.batch_size}")
        return f"DataLoader({', '.join(parts)}) over {(self.dataset or '?')[:80]}"


def loaders(texts: dict[int, str]) -> dict[int, list[LoaderSettings]]:
    """Per rank (its file's text) its loaders' settings, each distinct one once, in the order
    first iterated."""
    out: dict[int, list[LoaderSettings]] = {}
    for rank, text in texts.items():
        seen: list[LoaderSettings] = []
        for line in text.splitlines():
            try:
                s = LoaderSettings.model_validate(json.loads(line))
            except (ValueError, ValidationError):
                continue
            if s not in seen and len(seen) < MAX_PER_RANK:
                seen.append(s)
        if seen:
            out[rank] = seen
    return out
