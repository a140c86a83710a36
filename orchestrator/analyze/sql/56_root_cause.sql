-- Root cause across ranks: who held everyone up. Every wait in a collective (V waited for the
-- group's last starter C during [s, e]) is followed to the rank whose own work caused it, over
-- collective and p2p waits alike (p2p waits alone are the pipeline's bubble, not a straggler,
-- so they only carry blame along): if C was itself waiting
-- for another rank during most of [s, e], the wait is passed on to that rank, hop by hop (a
-- stage-1 rank that reaches its DP all-reduce last only because it waited for its p2p input
-- from a slow stage-0 rank passes the blame to that stage-0 rank).
-- Reads: nccl_waits, gap_attr, islands, loop_thread, osrt. Provides:
--   blame_edges(victim, via, root, s, e, ns, hops)   each collective wait, the rank it waited
--       for (via), the rank it is blamed on (root) and the interval of the last hop (when the
--       root was late, on the root's own timeline)
--   root_blame(root, caused_ns, n_waits, victims, vias, max_hops)
--   root_context(rank, range_group, ns)   the root's GPU gaps by CPU range while it was late
--   root_busy(rank, wait_ns, busy_ns)     how much of that time its GPU ran compute kernels
--   root_cpu(rank, call, ns)              its loop thread's OS calls in that time
-- A hop is taken when the culprit itself waited >= half of the interval it is blamed for.
CREATE OR REPLACE TEMP TABLE blame_0 AS
SELECT rank AS victim, waited_for AS via, waited_for AS root, s, e, e - s AS ns, 0 AS hops
FROM nccl_waits WHERE kind = 'collective';

-- Three hops cover a pipeline of four stages; each hop is one set-based statement.
CREATE OR REPLACE TEMP MACRO blame_hop(tbl) AS TABLE
WITH own AS (  -- the culprit's own waits inside the interval it was blamed for
    SELECT b.victim, b.via, b.root, b.s, b.e, b.ns, b.hops, w.waited_for,
           sum(least(w.e, b.e) - greatest(w.s, b.s)) AS overlap,
           min(greatest(w.s, b.s)) AS os, max(least(w.e, b.e)) AS oe
    FROM query_table(tbl) b JOIN nccl_waits w ON w.rank = b.root AND w.s < b.e AND w.e > b.s AND w.waited_for <> b.victim
    GROUP BY ALL
), best AS (
    SELECT *, row_number() OVER (PARTITION BY victim, root, s ORDER BY overlap DESC, waited_for) AS i FROM own
)
SELECT b.victim, b.via,
       CASE WHEN o.overlap * 2 >= b.e - b.s THEN o.waited_for ELSE b.root END AS root,
       CASE WHEN o.overlap * 2 >= b.e - b.s THEN o.os ELSE b.s END AS s,
       CASE WHEN o.overlap * 2 >= b.e - b.s THEN o.oe ELSE b.e END AS e,
       b.ns, b.hops + CASE WHEN o.overlap * 2 >= b.e - b.s THEN 1 ELSE 0 END AS hops
FROM query_table(tbl) b LEFT JOIN best o ON o.victim = b.victim AND o.root = b.root AND o.s = b.s AND o.i = 1;

CREATE OR REPLACE TEMP TABLE blame_1 AS SELECT * FROM blame_hop('blame_0');
CREATE OR REPLACE TEMP TABLE blame_2 AS SELECT * FROM blame_hop('blame_1');
CREATE OR REPLACE TEMP TABLE blame_edges AS SELECT * FROM blame_hop('blame_2');
DELETE FROM blame_edges WHERE root = victim;  -- a cycle back to the victim blames no one

CREATE OR REPLACE TEMP TABLE root_blame AS
SELECT root, sum(ns) AS caused_ns, count(*) AS n_waits, list(DISTINCT victim ORDER BY victim) AS victims,
       list(DISTINCT via ORDER BY via) FILTER (WHERE via <> root) AS vias, max(hops) AS max_hops
FROM blame_edges GROUP BY root;

-- What the root rank's GPU and CPU did while it held the others up: its GPU gaps there by
-- CPU range (gap_attr), and how much of that time its GPU was busy.
CREATE OR REPLACE TEMP VIEW root_raw AS SELECT root AS rank, 'w' AS cls, s, e FROM blame_edges WHERE e > s;
CREATE OR REPLACE TEMP TABLE root_windows AS SELECT rank, s, e FROM union_intervals('root_raw');

CREATE OR REPLACE TEMP VIEW root_context AS
SELECT w.rank, g.range_group, sum(least(g.e, w.e) - greatest(g.s, w.s)) AS ns
FROM root_windows w JOIN gap_attr g ON g.rank = w.rank AND g.s < w.e AND g.e > w.s
GROUP BY ALL;

CREATE OR REPLACE TEMP VIEW root_busy AS
SELECT w.rank, any_value(t.ns) AS wait_ns, coalesce(sum(least(i.e, w.e) - greatest(i.s, w.s)), 0) AS busy_ns
FROM root_windows w
JOIN (SELECT rank, sum(e - s) AS ns FROM root_windows GROUP BY rank) t USING (rank)
LEFT JOIN islands i ON i.rank = w.rank AND i.cls = 'compute' AND i.s < w.e AND i.e > w.s
GROUP BY w.rank;

-- The root rank's loop thread in those windows: time in each OS call (OS runtime trace).
CREATE OR REPLACE TEMP VIEW root_cpu AS
SELECT w.rank, o.name AS call, sum(least(o."end", w.e) - greatest(o.start, w.s)) AS ns
FROM root_windows w JOIN loop_thread l USING (rank)
JOIN osrt o ON o.rank = w.rank AND o.tid = l.tid AND o.start < w.e AND o."end" > w.s
GROUP BY ALL;
