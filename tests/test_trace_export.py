"""`orch export-trace` on real H200 exports: the Perfetto protobuf parses with Perfetto's own
published schema (perfetto_trace_pb2), its slices nest per track and equal what plain sqlite3
reads from the exports; the JSON holds the same slices; past --max-events the ranks the
findings name are kept and the rest are said to be left out."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from tests.conftest import run_orch

pytestmark = pytest.mark.replay

E2E = Path(__file__).parent / "fixtures" / "gpu_e2e"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("trace")
    exports = {}
    for rank in (0, 1):
        gz, = E2E.glob(f"ddp_r{rank}_*.sqlite.gz")
        exports[rank] = d / gz.name[: -len(".gz")]
        with gzip.open(gz, "rb") as fi, open(exports[rank], "wb") as fo:
            shutil.copyfileobj(fi, fo)
    p = run_orch("analyze", *map(str, exports.values()), "--out", str(d / "store"))
    assert p.returncode == 0, p.stderr
    return {"store": d / "store" / "profile.duckdb", "dir": d, **{f"r{r}": e for r, e in exports.items()}}


def _gpu_oracle(export: Path) -> Counter:
    """(name, duration ns) of every kernel, copy and memset, straight from the export."""
    con = sqlite3.connect(export)
    try:
        rows = con.execute("SELECT s.value, k.end - k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                           "JOIN StringIds s ON s.id = k.shortName").fetchall()
        rows += [("memcpy", d) for d, in con.execute("SELECT end - start FROM CUPTI_ACTIVITY_KIND_MEMCPY")]
        rows += [("memset", d) for d, in con.execute("SELECT end - start FROM CUPTI_ACTIVITY_KIND_MEMSET")]
    finally:
        con.close()
    return Counter(rows)


def _slices(path: Path) -> dict[int, list[tuple[str, str, int, int]]]:
    """Per rank (pid): (category, name, start, end) rebuilt from BEGIN/END pairs per track,
    asserting every END closes an open slice and timestamps never go back."""
    from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    pid_of: dict[int, int] = {}
    parent: dict[int, int] = {}
    open_: dict[int, list] = defaultdict(list)
    out: dict[int, list] = defaultdict(list)
    last = 0
    for p in trace.packet:
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            if d.HasField("process"):
                pid_of[d.uuid] = d.process.pid
            elif d.parent_uuid:
                parent[d.uuid] = d.parent_uuid
            continue
        e = p.track_event
        assert p.timestamp >= last
        last = p.timestamp
        if e.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            open_[e.track_uuid].append((e.categories[0], e.name, p.timestamp))
        else:
            assert e.type == pb.TrackEvent.TYPE_SLICE_END and open_[e.track_uuid], "END without BEGIN"
            cat, name, start = open_[e.track_uuid].pop()
            out[pid_of[parent[e.track_uuid]]].append((cat, name, start, p.timestamp))
    assert not any(open_.values()), "slices never closed"
    return out


def test_pftrace_parses_and_equals_the_exports(run: dict[str, Path]) -> None:
    pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    out = run["dir"] / "t.pftrace"
    p = run_orch("export-trace", str(run["store"]), "-o", str(out))
    assert p.returncode == 0, p.stderr
    got = _slices(out)
    assert sorted(got) == [0, 1]
    for rank in (0, 1):
        gpu = Counter(("memcpy" if n.startswith("memcpy") else n, e - s)
                      for c, n, s, e in got[rank] if c in ("compute", "comm", "memory"))
        assert gpu == _gpu_oracle(run[f"r{rank}"])
    # The JSON trace of the same store holds the same slices.
    js = run["dir"] / "t.json"
    assert run_orch("export-trace", str(run["store"]), "-o", str(js)).returncode == 0
    events = [e for e in json.loads(js.read_text())["traceEvents"] if e["ph"] == "X"]
    for rank in (0, 1):
        want = Counter((c, n, round((e - s) / 1000.0, 3)) for c, n, s, e in got[rank])
        have = Counter((e["cat"], e["name"], round(e["dur"], 3)) for e in events if e["pid"] == rank)
        assert have == want
    assert "ENVIRONMENT" not in js.read_text()


def test_pftrace_written_in_parts_is_the_same_trace(run: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A trace is sorted and written one part of the timeline at a time (sorting millions of
    packets at once ran out of DuckDB's memory cap): cut into many parts, it is the trace
    written in one part, byte for byte (every packet of a timestamp is in one part)."""
    pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    from orchestrator.export import perfetto
    from orchestrator.export.trace import export_trace

    one = run["dir"] / "one-part.pftrace"
    many = run["dir"] / "many-parts.pftrace"
    export_trace(run["store"], one)
    parts = []
    real = perfetto.execute
    monkeypatch.setattr(perfetto, "PART_PACKETS", 500)
    monkeypatch.setattr(perfetto, "execute", lambda con, sql, params=None: (
        parts.append(sql) if sql == perfetto._PART else None, real(con, sql, params))[1])
    export_trace(run["store"], many)
    assert len(parts) > 10
    assert many.read_bytes() == one.read_bytes()
    assert sorted(slices := _slices(many)) == [0, 1] and all(len(v) > 2_000 for v in slices.values())


def test_past_the_limit_the_blamed_rank_is_kept(run: dict[str, Path]) -> None:
    """Rank 1 sleeps in data_load (the fixture's README): the findings name it, so a limit that
    holds one rank keeps rank 1, and the trace says what was left out."""
    pytest.importorskip("perfetto.protos.perfetto.trace.perfetto_trace_pb2")
    con = sqlite3.connect(run["r1"])
    n1 = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in
             ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"))
    con.close()
    out = run["dir"] / "one.pftrace"
    p = run_orch("export-trace", str(run["store"]), "-o", str(out), "--max-events", str(n1 + 3000))
    assert p.returncode == 0, p.stderr
    assert "1 of 2 ranks left out" in p.stderr and "kept: 1" in p.stderr
    assert sorted(_slices(out)) == [1]
    p = run_orch("export-trace", str(run["store"]), "-o", str(run["dir"] / "zero.json"), "--ranks", "0")
    assert p.returncode == 0 and "1 ranks" in p.stdout and "not asked for (--ranks)" in p.stderr
    assert {e["pid"] for e in json.loads((run["dir"] / "zero.json").read_text())["traceEvents"]} == {0}


@pytest.mark.parametrize(("args", "needle"), [
    (["-o", "t.txt"], "name the trace .pftrace"),
    (["-o", "t.pftrace", "--ranks", "7"], "no rank 7"),
    (["-o", "t.pftrace", "--ranks", "x"], "is not a rank or range"),
    (["-o", "t.pftrace", "--max-events", "0"], "is not a whole number > 0"),
])
def test_bad_trace_options_say_what_to_do(run: dict[str, Path], args: list[str], needle: str) -> None:
    args = [a if not a.startswith("t.") else str(run["dir"] / a) for a in args]
    p = run_orch("export-trace", str(run["store"]), *args)
    assert p.returncode == 2 and needle in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) <= 2
