"""Synchronous memsets (nsys analyze cuda-sync-memset): the sync_memcpy rule over memsets."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from orchestrator.analyze.rules.sync_memcpy import SyncMemcpy


@dataclass
class SyncMemset(SyncMemcpy):
    kind: ClassVar[str] = "sync_memset"
    what: ClassVar[str] = "memset"


RULE = SyncMemset()
