"""What a map writes has one version: collect/parts.MAP_VERSION, which the collect compares
before it reuses a part (older parts are mapped again, never misread). The shape of the map's
tables is pinned here beside it, so that a change to their columns (a header's typed entry in
metrics/sql, a clock column, an event table's columns) fails until MAP_VERSION is bumped with it."""

from __future__ import annotations

import hashlib

import pytest

from orchestrator.collect.parts import MAP_VERSION
from orchestrator.store.map_tables import SUMMARIES, stack_columns
from orchestrator.store.schema import EVENT_SCHEMA

pytestmark = pytest.mark.fast

# (MAP_VERSION, the digest of the shape it was bumped for)
PINNED = (17, "aec6f732eaee0b06")


def shape_digest() -> str:
    """A digest of every column the map writes: its event parts', its stacked part's, and each
    mapped table's (name, columns with types, the columns that are times, its own part or not)."""
    shape = (sorted((t, tuple(map(tuple, cols))) for t, cols in EVENT_SCHEMA.items()),
             tuple(stack_columns()),
             tuple((s.table, s.source, s.columns, s.clock, s.own) for s in SUMMARIES))
    return hashlib.sha256(repr(shape).encode()).hexdigest()[:16]


def test_the_map_shape_changes_only_with_map_version() -> None:
    digest = shape_digest()
    assert (MAP_VERSION, digest) == PINNED, (
        f"the map's columns are now {digest}, MAP_VERSION {MAP_VERSION} (pinned: {PINNED}): where they changed, bump "
        "MAP_VERSION in orchestrator/collect/parts.py and pin the new pair here")
