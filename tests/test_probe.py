"""The probe's table -> columns map (one query over `sqlite_master` x `pragma_table_info`)
against plain sqlite3 asking each table by itself, on the real H200 exports, and on tables
named the way no export names them (quotes, spaces) beside a view, which is no table."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from orchestrator.collect.extract import missing_columns
from orchestrator.collect.parts import probe_from_json, probe_to_json
from orchestrator.collect.probe import probe
from orchestrator.store.tables import TABLES

pytestmark = pytest.mark.fast


def _by_pragma(path: Path) -> dict[str, set[str]]:
    con = sqlite3.connect(path)
    try:
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {t: {r[1] for r in con.execute('PRAGMA table_info("{}")'.format(t.replace('"', '""')))}
                for t in names}
    finally:
        con.close()


def test_columns_of_every_table_on_real_exports(gpu_fixtures: Path) -> None:
    files = sorted(gpu_fixtures.rglob("*.sqlite"))
    assert files
    for f in files:
        p = probe(f)
        assert p.error is None, (f, p.error)
        want = _by_pragma(f)
        assert len(want) > 30 and "CUPTI_ACTIVITY_KIND_KERNEL" in want
        assert p.tables == want, f


def _altered(gpu_fixtures: Path, dest: Path, *statements: str) -> Path:
    """A copy of the first real export with `statements` run on it."""
    shutil.copy(sorted(gpu_fixtures.rglob("*.sqlite"))[0], dest)
    con = sqlite3.connect(dest)
    for sql in statements:
        con.execute(sql)
    con.commit()
    con.close()
    return dest


def test_odd_table_names_and_views(gpu_fixtures: Path, tmp_path: Path) -> None:
    f = _altered(gpu_fixtures, tmp_path / "odd.sqlite", 'CREATE TABLE "we""ird name" ("a b" INTEGER, c TEXT)',
                 'CREATE VIEW v AS SELECT c FROM "we""ird name"')
    p = probe(f)
    assert p.error is None
    assert p.tables['we"ird name'] == {"a b", "c"}
    assert "v" not in p.tables
    assert p.tables == _by_pragma(f)


def test_a_maps_meta_keeps_what_the_reduce_asks(gpu_fixtures: Path, tmp_path: Path) -> None:
    """The probe a map writes to its meta keeps only the event tables' expected columns, and
    answers missing_columns as the full probe does: on every real export, and on one whose
    kernel table lost `shortName` and whose NVTX table lost `eventType` (older nsys)."""
    f = _altered(gpu_fixtures, tmp_path / "old.sqlite", "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL DROP COLUMN shortName",
                 "ALTER TABLE NVTX_EVENTS DROP COLUMN eventType")
    for path in [*sorted(gpu_fixtures.rglob("*.sqlite")), f]:
        full = probe(path)
        slim = probe_from_json(probe_to_json(full, keep_env=False))
        assert missing_columns(slim) == missing_columns(full), path
        assert len(slim.tables) <= len(TABLES) < len(full.tables)
    assert missing_columns(probe(f)) == ["CUPTI_ACTIVITY_KIND_KERNEL.shortName", "NVTX_EVENTS.eventType"]
