-- Root cause across ranks: who held everyone up. Every wait in a collective (V waited for the
-- group's last starter C during [s, e]) is followed to the rank whose own work caused it, over
-- collective and p2p waits alike (p2p waits alone are the pipeline's bubble, not a straggler,
-- so they only carry blame along). C is late by e - s. If since its last synchronisation (its
-- previous collective's end, or its window start) C spent at least half of that lateness more
-- time waiting for other ranks than V did since V's own, C fell behind because it waited: the
-- blame passes to the rank C waited for most, hop by hop (a stage-1 rank that reaches its DP
-- all-reduce last only because its p2p input came late from a slow stage-0 rank passes the
-- blame to that stage-0 rank, although it was busy computing when its peer started waiting).
-- Reads: coll, nccl_waits, win, gap_attr, islands, loop_thread, osrt. Provides:
--   blame_edges(victim, via, root, s, e, ns, hops)   each collective wait, the rank it waited
--       for (via), the rank it is blamed on (root) and the interval of the last hop
--   root_blame(root, caused_ns, n_waits, victims, vias, max_hops)
--   root_windows(rank, s, e)              when the root fell behind: from its last
--       synchronisation before each blamed interval to that interval's end
--   root_context(rank, range_group, ns)   the root's GPU gaps by CPU range in those windows
--   root_busy(rank, wait_ns, busy_ns)     how much of that time its GPU ran compute kernels
--   root_cpu(rank, call, ns)              its loop thread's OS calls in that time
CREATE OR REPLACE TABLE blame_0 AS
SELECT rank AS victim, waited_for AS via, waited_for AS root, s, e, e - s AS ns, 0 AS hops
FROM nccl_waits WHERE kind = 'collective';

-- A rank's last synchronisation at or before t: the end of its latest collective, else its w0.
CREATE OR REPLACE MACRO last_sync(r, t) AS coalesce(
    (SELECT max(c."end") FROM coll c WHERE c.rank = r AND c."end" <= t),
    (SELECT w.w0 FROM win w WHERE w.rank = r));

-- One hop; three hops cover a pipeline of four stages, each one set-based statement.
CREATE OR REPLACE MACRO blame_hop(tbl) AS TABLE
WITH b AS (
    SELECT *, last_sync(root, e) AS c_sync, last_sync(victim, s) AS v_sync FROM query_table(tbl)
), culprit AS (  -- the culprit's waiting since its last sync, by whom it waited for
    SELECT b.victim, b.root, b.s, w.waited_for, sum(least(w.e, b.e) - greatest(w.s, b.c_sync)) AS ns,
           min(greatest(w.s, b.c_sync)) AS ws, max(least(w.e, b.e)) AS we
    FROM b JOIN nccl_waits w ON w.rank = b.root AND w.s < b.e AND w.e > b.c_sync
    GROUP BY ALL
), own AS (  -- the victim's waiting since its own last sync (what waiting is normal here)
    SELECT b.victim, b.root, b.s, coalesce(sum(least(w.e, b.s) - greatest(w.s, b.v_sync)), 0) AS ns
    FROM b LEFT JOIN nccl_waits w ON w.rank = b.victim AND w.s < b.s AND w.e > b.v_sync
    GROUP BY ALL
), pick AS (
    SELECT c.*, sum(c.ns) OVER (PARTITION BY c.victim, c.root, c.s) AS total,
           row_number() OVER (PARTITION BY c.victim, c.root, c.s ORDER BY c.ns DESC, c.waited_for) AS i
    FROM culprit c WHERE c.waited_for <> c.victim
)
SELECT b.victim, b.via,
       CASE WHEN hop THEN p.waited_for ELSE b.root END AS root,
       CASE WHEN hop THEN p.ws ELSE b.s END AS s,
       CASE WHEN hop THEN p.we ELSE b.e END AS e,
       b.ns, b.hops + CASE WHEN hop THEN 1 ELSE 0 END AS hops
FROM b LEFT JOIN pick p ON p.victim = b.victim AND p.root = b.root AND p.s = b.s AND p.i = 1
LEFT JOIN own o ON o.victim = b.victim AND o.root = b.root AND o.s = b.s,
LATERAL (SELECT coalesce(2 * (p.total - coalesce(o.ns, 0)) >= b.e - b.s, false) AS hop);

CREATE OR REPLACE TABLE blame_1 AS SELECT * FROM blame_hop('blame_0');
CREATE OR REPLACE TABLE blame_2 AS SELECT * FROM blame_hop('blame_1');
CREATE OR REPLACE TABLE blame_edges AS SELECT * FROM blame_hop('blame_2');
DELETE FROM blame_edges WHERE root = victim;  -- a cycle back to the victim blames no one

CREATE OR REPLACE TABLE root_blame AS
SELECT root, sum(ns) AS caused_ns, count(*) AS n_waits, list(DISTINCT victim ORDER BY victim) AS victims,
       list(DISTINCT via ORDER BY via) FILTER (WHERE via <> root) AS vias, max(hops) AS max_hops
FROM blame_edges GROUP BY root;

-- What the root rank's GPU and CPU did while it held the others up: its GPU gaps there by
-- CPU range (gap_attr), and how much of that time its GPU was busy. A blamed wait that ended
-- before the root's window began (its w0, when it had no collective yet) gives a reversed
-- interval, which union_intervals leaves out (it once made a negative island there, and
-- "115% of that time" in the report).
CREATE OR REPLACE VIEW root_raw AS
SELECT root AS rank, 'w' AS cls, last_sync(root, e) AS s, e FROM blame_edges WHERE e > s;
CREATE OR REPLACE TABLE root_windows AS SELECT rank, s, e FROM union_intervals('root_raw');

-- (root_windows never overlap on a rank: overlapping() pairs them with gaps, islands, calls.)
CREATE OR REPLACE VIEW root_context AS
WITH g AS (SELECT rank, s AS start, e AS "end", range_group FROM gap_attr
           WHERE rank IN (SELECT rank FROM root_windows))
SELECT rank, range_group, sum(least("end", d_e) - greatest(start, d_s)) AS ns
FROM overlapping('root_windows', 'g') GROUP BY ALL;

CREATE OR REPLACE VIEW root_busy AS
WITH c AS (SELECT rank, s AS start, e AS "end" FROM islands
           WHERE cls = 'compute' AND rank IN (SELECT rank FROM root_windows)),
     b AS (SELECT rank, sum(least("end", d_e) - greatest(start, d_s)) AS ns FROM overlapping('root_windows', 'c')
           GROUP BY rank)
SELECT t.rank, t.ns AS wait_ns, coalesce(b.ns, 0) AS busy_ns
FROM (SELECT rank, sum(e - s) AS ns FROM root_windows GROUP BY rank) t LEFT JOIN b USING (rank);

-- The root rank's loop thread in those windows: time in each OS call (OS runtime trace).
CREATE OR REPLACE VIEW root_cpu AS
WITH o AS (SELECT o.rank, o.start, o."end", o.name FROM osrt o JOIN loop_thread l USING (rank, tid)
           WHERE o.rank IN (SELECT rank FROM root_windows))
SELECT rank, name AS call, sum(least("end", d_e) - greatest(start, d_s)) AS ns
FROM overlapping('root_windows', 'o') GROUP BY ALL;
