"""Each rank's DataLoader settings, as orch's loop marks wrote them in the job
(templates/orch_loop_marks.py.j2: `dumps/loaders.r<RANK>.jsonl`, a line per loader the rank
iterated): what the fix for a slow input depends on (no workers: the loop thread loads its own
data). A run directory is not trusted input: each file is read to a bound, each line parsed
strictly, and what does not parse is skipped."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

MAX_BYTES = 64 << 10  # a few loaders a rank; a program that makes one per step repeats itself
MAX_PER_RANK = 8
_NAME = re.compile(r"loaders\.r(\d{1,7})\.jsonl")


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


def loaders(folder: Path) -> dict[int, list[LoaderSettings]]:
    """Per rank its loaders' settings, each distinct one once, in the order first iterated."""
    out: dict[int, list[LoaderSettings]] = {}
    if not folder.is_dir():
        return out
    for p in sorted(folder.iterdir()):
        m = _NAME.fullmatch(p.name)
        if not m or not p.is_file():
            continue
        try:
            with p.open("rb") as fh:
                text = fh.read(MAX_BYTES).decode(errors="replace")
        except OSError:
            continue
        seen: list[LoaderSettings] = []
        for line in text.splitlines():
            try:
                s = LoaderSettings.model_validate(json.loads(line))
            except (ValueError, ValidationError):
                continue
            if s not in seen and len(seen) < MAX_PER_RANK:
                seen.append(s)
        if seen:
            out[int(m.group(1))] = seen
    return out
