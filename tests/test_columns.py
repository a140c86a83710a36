"""Per-rank columns are declared once on RankMetrics' fields (analyze/model_columns.py); the
renderers and the report's mapping from the views only iterate over them. These checks hold
the declarations to the SQL that provides them and to the orders users read."""

from __future__ import annotations

import random
from decimal import Decimal

import pytest

from orchestrator import sqlmodules
from orchestrator.analyze.model_columns import columns, diff_columns, html_columns, terminal_columns
from orchestrator.analyze.model_report import RankMetrics
from orchestrator.analyze.rank_pick import pick_ranks
from orchestrator.analyze.units import ms, ms6, ms_or_none
from orchestrator.sqlmodules import SQL_DIR

pytestmark = pytest.mark.fast


def _provided() -> dict[str, set[str]]:
    files = [(p.name, p.read_text()) for p in SQL_DIR.iterdir() if p.name.endswith(".sql")]
    return {p.name: set(p.columns) for m in sqlmodules.parse_all(files) for p in m.provides}


def test_every_field_reads_a_column_its_view_provides() -> None:
    provided = _provided()
    for name, col in columns(RankMetrics).items():
        if col.view:  # "": built from other views (gaps, steps)
            assert col.source_of(name) in provided[col.view], (name, col.view, col.source_of(name))


def test_each_view_places_its_columns_once() -> None:
    for wide in (False, True):
        at = [c.wide if wide else c.narrow for _, c in terminal_columns(RankMetrics, wide)]
        assert at == list(range(1, len(at) + 1)), (wide, at)
    assert [c.at for _, c in html_columns(RankMetrics)] == list(range(1, len(html_columns(RankMetrics)) + 1))
    assert [c.at for _, c in diff_columns(RankMetrics)] == list(range(1, len(diff_columns(RankMetrics)) + 1))


def test_ms_rounds_as_each_caller_needs() -> None:
    assert ms(1_234_567) == 1.235 and ms(None) == 0.0 and ms_or_none(None) is None
    assert ms(1_234_567, 6) == 1.234567 and ms(1234567.4, 6) == 1.234567


def test_ms6_is_ms_or_none_at_six_digits() -> None:
    """The stats tables' one-call conversion returns what ms_or_none(ns, 6) does, value and type,
    for the ints, floats and Decimals DuckDB hands back (a seeded sample of each)."""
    rnd = random.Random(6)
    values = [None, 0, -5, 2**53 + 1, 2**62, 0.5, 1e-7, Decimal("1234567.4999995")]
    values += [rnd.randrange(2**50) for _ in range(2000)] + [rnd.random() * 1e12 for _ in range(2000)]
    values += [Decimal(rnd.randrange(2**40)) / 7 for _ in range(500)]
    got = [(ms6(v), type(ms6(v))) for v in values]
    assert got == [(ms_or_none(v, 6), type(ms_or_none(v, 6))) for v in values]


def test_pick_ranks_keeps_the_named_first_then_samples() -> None:
    have = list(range(100))
    got = pick_ranks(have, [(97, "finding"), (3, "victim"), (97, "finding")], 6)
    assert list(got) == [0, 3, 25, 50, 74, 97]  # the named, then an even sample of the rest
    assert got[97] == "finding" and got[3] == "victim"
    assert list(pick_ranks(have[:5], [(4, "finding")], 6)) == have[:5]  # all fit: every rank
    budget = pick_ranks(have, [(50, "p")], fill="order", whole=False,
                        fits=lambda rk, chosen: len(chosen) < 3)
    assert list(budget) == [0, 1, 50]
