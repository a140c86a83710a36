-- Collective matching: the k-th NCCL collective kernel of one name on every rank of a communicator
-- group (same stage and tp index when the layout is known; all ranks otherwise) is one
-- collective. Only collectives seen on every rank of the group count. A rank waits from
-- its own start until the latest start in the group, at most the kernel's duration.
CREATE OR REPLACE TEMP TABLE coll AS
WITH k AS (
    SELECT o.rank, coalesce(r.stage, 0) AS g1, coalesce(r.tp_index, 0) AS g2, o.name, o.start, o."end",
           row_number() OVER (PARTITION BY o.rank, o.name ORDER BY o.start) AS kth,
           CASE WHEN o.start >= w.w0 AND o.start < w.w1 THEN 1 ELSE 0 END AS in_win
    FROM gpu_ops o JOIN ranks r USING (rank) JOIN win w USING (rank)
    WHERE o.kind = 'kernel' AND o.category = 'comm'
      AND NOT regexp_matches(o.name, 'SendRecv|_Send|_Recv')  -- point-to-point is not a collective
), gsize AS (
    SELECT coalesce(stage, 0) AS g1, coalesce(tp_index, 0) AS g2, count(*) AS n
    FROM ranks WHERE rank IN (SELECT rank FROM win) GROUP BY ALL
), m AS (
    SELECT k.*, max(k.start) OVER c AS latest, min(k.start) OVER c AS earliest,
           count(*) OVER c AS n_seen, min(k.in_win) OVER c AS all_in_win
    FROM k WINDOW c AS (PARTITION BY g1, g2, name, kth)
)
-- A collective counts when every rank of the group ran it inside its own window.
SELECT m.*, least(m.latest - m.start, m."end" - m.start) AS wait_ns,
       (m.start = m.latest AND m.latest > m.earliest) AS is_last, gs.n AS group_size
FROM m JOIN gsize gs USING (g1, g2)
WHERE m.n_seen = gs.n AND gs.n > 1 AND m.all_in_win = 1;

CREATE OR REPLACE TEMP TABLE coll_rank AS
WITH caused AS (
    SELECT l.rank, sum(o.wait_ns) AS ns
    FROM coll l JOIN coll o
      ON o.g1 = l.g1 AND o.g2 = l.g2 AND o.name = l.name AND o.kth = l.kth AND o.rank <> l.rank
    WHERE l.is_last GROUP BY l.rank
)
SELECT c.rank, count(*) AS n_coll, sum(c.wait_ns) AS nccl_wait_ns,
       sum(CASE WHEN c.is_last THEN 1 ELSE 0 END) AS late_count,
       any_value(c.group_size) AS group_size,
       coalesce(any_value(cs.ns), 0) AS wait_caused_ns,
       median(CASE WHEN c.is_last THEN c.start - c.earliest END) AS median_lateness_ns
FROM coll c LEFT JOIN caused cs USING (rank)
GROUP BY c.rank;

-- The time others spent waiting for a late rank, as a union of intervals on that rank's
-- clock: from the group's earliest start to the late rank's own start.
CREATE OR REPLACE TEMP TABLE late_windows AS
WITH w AS (SELECT rank, earliest AS s, start AS e FROM coll WHERE is_last),
m AS (SELECT *, max(e) OVER (PARTITION BY rank ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS pe FROM w),
g AS (SELECT *, sum(CASE WHEN pe IS NULL OR s > pe THEN 1 ELSE 0 END) OVER (PARTITION BY rank ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS grp FROM m)
SELECT rank, min(s) AS s, max(e) AS e FROM g GROUP BY rank, grp;
