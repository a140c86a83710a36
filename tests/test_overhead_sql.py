"""View capture_overhead (metrics/sql/67_capture_overhead.sql) on small hand-made tables: the
estimate's formula and the two ways a rank is flagged distorted (over 5 % of its window, or
far above the other ranks), with the expected values computed here from the documented
formula, not by orch."""

from __future__ import annotations

import duckdb
import pytest

from orchestrator.analyze.model_overhead import RankOverhead
from orchestrator.analyze.overhead import overhead_line
from orchestrator.sqlmodules import SQL_DIR
from orchestrator.store.map_tables import SUMMARIES

pytestmark = pytest.mark.fast

SQL = SQL_DIR / "67_capture_overhead.sql"
API = SQL_DIR / "67_capture_api.sql"
CALL_NS = 7600
WINDOW_NS = 1_000_000_000


def _overhead(calls: dict[int, int], profiler_ns: dict[int, int], gaps_ns: dict[int, int],
              mapped: dict[int, tuple[int, int]] | None = None) -> dict[int, dict]:
    """`mapped`: ranks whose window's calls and launches a map counted (map_capture_api): their
    rows of capture_api are the map's, taken as the analysis takes them (map_tables.Summary.taken),
    the other ranks' counted from their CUDA calls."""
    con = duckdb.connect()
    con.execute("CREATE TABLE map_ranks(rank INT, off BIGINT)")
    con.execute(next(s for s in SUMMARIES if s.table == "map_capture_api").ddl())
    for rk, (n, launches) in (mapped or {}).items():
        con.execute("INSERT INTO map_ranks VALUES (?, 0)", [rk])
        con.execute("INSERT INTO map_capture_api VALUES (?, ?, ?)", [rk, n, launches])
    con.execute("CREATE TABLE win(rank INT, w0 BIGINT, w1 BIGINT)")
    con.execute("CREATE TABLE cuda_api(rank INT, start BIGINT, name VARCHAR)")
    con.execute('CREATE TABLE profiler_overhead(rank INT, start BIGINT, "end" BIGINT)')
    con.execute("CREATE TABLE small_gaps(rank INT, n BIGINT, ns BIGINT)")
    for rk in calls:
        con.execute("INSERT INTO win VALUES (?, ?, ?)", [rk, 0, WINDOW_NS])
        # half launches, half other calls, all inside the window; one call outside it
        con.execute("INSERT INTO cuda_api SELECT ?, i * 1000, CASE WHEN i % 2 = 0 THEN 'cudaLaunchKernel_v7000' "
                    "ELSE 'cudaMemcpyAsync_v3020' END FROM range(?) t(i)", [rk, calls[rk]])
        con.execute("INSERT INTO cuda_api VALUES (?, ?, 'cudaLaunchKernel_v7000')", [rk, WINDOW_NS + 5])
        if profiler_ns.get(rk):  # one flush straddling the window's end: only the inside counts
            con.execute("INSERT INTO profiler_overhead VALUES (?, ?, ?)",
                        [rk, WINDOW_NS - profiler_ns[rk], WINDOW_NS + 7_000_000])
        con.execute("INSERT INTO small_gaps VALUES (?, 10, ?)", [rk, gaps_ns[rk]])
    con.execute((SQL_DIR / "00_macros.sql").read_text())  # loo_ref
    con.execute(API.read_text())
    taken = next(s for s in SUMMARIES if s.table == "map_capture_api").taken("map_ranks")
    con.execute("ALTER TABLE capture_api RENAME TO own")
    con.execute(f"CREATE TABLE capture_api AS SELECT * FROM own ANTI JOIN map_ranks USING (rank) "
                f"UNION ALL BY NAME {taken}")
    con.execute(SQL.read_text())
    return {r[0]: dict(zip([d[0] for d in con.description], r, strict=True))
            for r in con.execute("SELECT * FROM capture_overhead ORDER BY rank").fetchall()}


def test_a_mapped_rank_counts_the_maps_calls_not_its_own() -> None:
    got = _overhead({0: 1000, 1: 1000}, {}, {0: 100_000_000, 1: 100_000_000}, mapped={1: (400, 150)})
    assert (got[0]["api_calls"], got[0]["launches"]) == (1000, 500)
    assert (got[1]["api_calls"], got[1]["launches"]) == (400, 150) and got[1]["est_ns"] == 400 * CALL_NS


def test_estimate_is_profiler_time_plus_capped_call_cost() -> None:
    got = _overhead({0: 1000, 1: 1000}, {0: 2_000_000}, {0: 100_000_000, 1: 3_000_000})
    assert got[0]["api_calls"] == 1000 and got[0]["launches"] == 500
    assert got[0]["est_ns"] == 2_000_000 + 1000 * CALL_NS  # call cost under the launch gaps
    assert got[1]["est_ns"] == 3_000_000  # capped by the 3 ms of launch gaps
    # the error is the calibration's share of the call term; the profiler's time is measured
    assert got[0]["est_err_ns"] == pytest.approx(0.81 * 1000 * CALL_NS)
    assert got[1]["est_err_ns"] == pytest.approx(0.81 * 3_000_000)
    assert got[0]["share"] == (2_000_000 + 1000 * CALL_NS) / WINDOW_NS


def test_one_rank_far_above_the_others_is_distorted() -> None:
    """Three ranks at 1 % and one at 3.5 %: under 5 %, but over 3x the others' median, so
    flagged; the same 3.5 % among ranks at 2 % is not; 6 % is flagged whatever the others do."""
    def calls(share: dict[int, float]) -> dict[int, int]:
        return {r: round(s * WINDOW_NS / CALL_NS) for r, s in share.items()}

    def want(got: dict[int, dict]) -> list[bool]:
        out = []
        for r, row in sorted(got.items()):
            others = sorted(o["share"] for k, o in got.items() if k != r)
            mid = len(others) // 2
            med = others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2
            out.append(row["share"] > 0.05 or (row["share"] > 0.02 and row["share"] > 3 * med))
        return out

    gaps = {r: WINDOW_NS for r in range(4)}
    got = _overhead(calls({0: 0.01, 1: 0.01, 2: 0.01, 3: 0.035}), {}, gaps)
    assert [got[r]["distorted"] for r in range(4)] == want(got) == [False, False, False, True]
    even = _overhead(calls({0: 0.02, 1: 0.02, 2: 0.02, 3: 0.035}), {}, gaps)
    assert [even[r]["distorted"] for r in range(4)] == want(even) == [False] * 4
    high = _overhead(calls({0: 0.06, 1: 0.06}), {}, {0: WINDOW_NS, 1: WINDOW_NS})
    assert [high[r]["distorted"] for r in range(2)] == want(high) == [True, True]


def test_past_16_ranks_the_reference_is_every_rank() -> None:
    """19 ranks at 1 % and one at 3.5 %: the reference is the median of all 20 ranks (1 %), not
    a pair per two ranks (which would grow with ranks squared); the one rank is flagged."""
    share = {r: 0.01 for r in range(20)} | {7: 0.035}
    got = _overhead({r: round(s * WINDOW_NS / CALL_NS) for r, s in share.items()}, {},
                    {r: WINDOW_NS for r in share})
    assert [r for r, row in got.items() if row["distorted"]] == [7]


def test_header_line_names_what_the_estimate_is_made_of() -> None:
    """The header says where a distorted rank's estimate comes from: nsys' own recorded time,
    the per-call cost, or both; no line when no rank is distorted."""
    def rank(rk: int, profiler_ms: float, est_ms: float, calls: int, distorted: bool = True) -> RankOverhead:
        return RankOverhead(rank=rk, window_ms=1000.0, profiler_ms=profiler_ms, api_calls=calls, launches=0,
                            est_ms=est_ms, share_pct=est_ms / 10, distorted=distorted,
                            calls_capped=calls * CALL_NS / 1e6 > est_ms - profiler_ms)
    flush = overhead_line([rank(3, 80.0, 80.0, 0), rank(4, 0.0, 1.0, 10, False)], CALL_NS)
    assert flush == ("capture overhead ≈ 8 % of the window on rank 3 (estimated: 80 ms of nsys' own "
                     "PROFILER_OVERHEAD): step times are inflated")
    both = overhead_line([rank(0, 2.0, 78.0, 10_000), rank(1, 0.0, 60.0, 8_000)], CALL_NS)
    assert both == ("capture overhead ≈ 8 % of the window on rank 0 (1 other rank(s) too) (estimated: 2 ms of "
                    "nsys' own PROFILER_OVERHEAD + 10,000 traced CUDA calls at ~7.6 µs each, 76 ms): step times "
                    "are inflated, launch gaps partly nsys' own")
    # 20,000 calls would be 152 ms; the GPU waited only 60 ms between launches
    capped = overhead_line([rank(2, 0.0, 60.0, 20_000)], CALL_NS)
    assert "20,000 traced CUDA calls at ~7.6 µs each, capped at the 60 ms of launch gaps)" in capped
    assert overhead_line([rank(0, 0.0, 1.0, 10, False)], CALL_NS) == ""
