"""The shared SQL macros (metrics/sql/00_macros.sql) against plain-Python computations."""

from __future__ import annotations

import duckdb
import pytest

from orchestrator.sqlmodules import SQL_DIR

pytestmark = pytest.mark.fast


def _merged(ivs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of closed intervals as disjoint islands (textbook merge)."""
    out: list[list[int]] = []
    for s, e in sorted(ivs):
        if not out or s > out[-1][1]:
            out.append([s, e])
        else:
            out[-1][1] = max(out[-1][1], e)
    return [(s, e) for s, e in out]


def test_union_intervals_and_length_with_duplicates() -> None:
    """Random overlapping intervals with many exact duplicates (a GPU op under two nested ranges
    of one group is in phase_ops twice). Duplicates must not survive: two window sorts could
    order equal rows differently and put one in the previous island (at 512 ranks, when the
    analysis spills: a phase's GPU time 3 % too high, different from run to run)."""
    con = duckdb.connect()
    con.execute("SET threads = 2")
    con.execute((SQL_DIR / "00_macros.sql").read_text())
    con.execute("""CREATE TEMP TABLE iv AS
        SELECT rank, cls, s, s + len AS e FROM (
            SELECT (i % 64)::INTEGER AS rank, 'c' || (i // 64 % 2) AS cls,
                   (i // 128) * 30 + hash(i, 1) % 25 AS s, hash(i, 2) % 40 AS len
            FROM range(0, 100000) r(i)), range(3) d(k)
        WHERE k = 0 OR hash(rank, s, k) % 3 = 0""")  # one to three copies of each interval
    by: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for rank, cls, s, e in con.execute("SELECT * FROM iv").fetchall():
        by.setdefault((rank, cls), []).append((s, e))
    truth = {k: _merged(v) for k, v in by.items()}
    assert sum(len(v) for v in by.values()) > len({x for v in by.values() for x in v}) + 10_000  # duplicates
    got: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for r, c, s, e in con.execute("SELECT * FROM union_intervals('iv') ORDER BY rank, cls, s").fetchall():
        got.setdefault((r, c), []).append((s, e))
    assert got == truth
    # a reversed row (e < s) is not an interval: it neither forms nor extends an island
    con.execute("INSERT INTO iv VALUES (0, 'c0', -50, -60), (0, 'c0', 10, 5)")
    assert con.execute("SELECT count(*) FROM union_intervals('iv') WHERE s < 0").fetchone() == (0,)
    first = con.execute("SELECT s, e FROM union_intervals('iv') WHERE rank = 0 AND cls = 'c0' ORDER BY s").fetchall()
    assert first == truth[(0, "c0")]
    # union_length: the islands' total length per (rank, cls), reversed rows left out as well
    lengths = {k: sum(e - s for s, e in v) for k, v in truth.items()}
    assert dict(((r, c), n) for r, c, n in con.execute("SELECT * FROM union_length('iv')").fetchall()) == lengths


def test_union_length_of_disjoint_and_nested_groups() -> None:
    """union_length sums the lengths where no interval of a (rank, cls) begins before an earlier
    one ends, and takes the running maximum elsewhere: groups of disjoint intervals (touching,
    one alone, zero-length ones), groups where one long interval holds later ones that do not
    overlap their neighbour (the nesting a lag alone would miss) and random overlapping ones,
    side by side in one table, against the textbook merge."""
    import random

    rng = random.Random(5)
    rows: list[tuple[int, str, int, int]] = []
    for rank in range(8):
        t = 0
        for _ in range(200):  # disjoint, some touching the one before, some of zero length
            t += rng.choice((0, 0, 1, 7))
            length = rng.choice((0, 3, 10))
            rows.append((rank, "disjoint", t, t + length))
            t += length
        rows.append((rank, "alone", 5, 9))
        base = 1000 * rank
        rows += [(rank, "held", base, base + 100), (rank, "held", base + 10, base + 20),
                 (rank, "held", base + 30, base + 40), (rank, "held", base + 150, base + 160)]
        for _ in range(100):
            s = rng.randrange(0, 2000)
            rows.append((rank, "random", s, s + rng.randrange(0, 50)))
    con = duckdb.connect()
    con.execute((SQL_DIR / "00_macros.sql").read_text())
    con.execute("CREATE TABLE iv (rank INTEGER, cls VARCHAR, s BIGINT, e BIGINT)")
    con.executemany("INSERT INTO iv VALUES (?, ?, ?, ?)", rows)
    by: dict[tuple[int, str], list[tuple[int, int]]] = {}
    for rank, cls, s, e in rows:
        by.setdefault((rank, cls), []).append((s, e))
    truth = {k: sum(e - s for s, e in _merged(v)) for k, v in by.items()}
    assert truth[(0, "held")] == 110  # the two inside the first count once, not three times
    got = {(r, c): n for r, c, n in con.execute("SELECT * FROM union_length('iv')").fetchall()}
    assert got == truth


def test_overlapping_pairs_match_brute_force() -> None:
    """overlapping(dis, ivs): every (interval, disjoint interval) pair that overlaps, from two
    ASOF joins; checked against the textbook double loop. The intervals include ones that span
    many gaps, zero-length ones, ones touching a gap's edge, and ranks with no gaps."""
    import random

    rng = random.Random(11)
    dis, ivs = [], []
    for rank in range(6):
        t = 0
        for _ in range(0 if rank == 5 else 60):  # rank 5: intervals but no gaps
            t += rng.randrange(1, 30)
            length = rng.randrange(1, 20)
            dis.append((rank, t, t + length))
            t += length
        for _ in range(300):
            s = rng.randrange(-50, t + 50)
            ivs.append((rank, s, s + rng.choice((0, 1, rng.randrange(1, 40), rng.randrange(100, 800)))))
        ivs += [(rank, d[2], d[2] + 5) for d in dis if d[0] == rank][:5]  # starts where a gap ends
    con = duckdb.connect()
    con.execute((SQL_DIR / "00_macros.sql").read_text())
    con.execute("CREATE TEMP TABLE dis (rank INTEGER, s BIGINT, e BIGINT)")
    con.execute('CREATE TEMP TABLE ivs (rank INTEGER, start BIGINT, "end" BIGINT, tag INTEGER)')
    con.execute("INSERT INTO dis VALUES " + ", ".join(map(str, dis)))
    con.execute("INSERT INTO ivs VALUES " + ", ".join(str((*v, i)) for i, v in enumerate(ivs)))
    got = sorted(con.execute('SELECT rank, start, "end", tag, d_s, d_e FROM overlapping(\'dis\', \'ivs\')').fetchall())
    want = sorted((r, s, e, i, ds, de) for i, (r, s, e) in enumerate(ivs)
                  for (dr, ds, de) in dis if dr == r and ds < e and de > s)
    assert len(want) > 1000
    assert got == want


def test_range_group_folds_numbers_not_names() -> None:
    """One group per kind of range: numbers that count steps, epochs or microbatches go, the
    numbers that are part of a name stay (the seed tutorial's `Step 3 Start` once made one
    phase-table row per step, each flagged as an outlier)."""
    con = duckdb.connect()
    con.execute((SQL_DIR / "00_macros.sql").read_text())
    cases = {"Step 3 Start": "Step # Start", "Epoch 1 Start": "Epoch # Start", "forward mb3": "forward",
             "backward, seq = 5": "backward", "step 12": "step", "ProfilerStep#3": "ProfilerStep",
             "x 10 y 20 z": "x # y # z", "a 1 2 b": "a # # b", "conv2d": "conv2d", "conv 2d": "conv 2d",
             "layers.3.attn": "layers.3.attn", "aten::add_": "aten::add_"}
    got = {t: con.execute("SELECT range_group(?)", [t]).fetchone()[0] for t in cases}
    assert got == cases
