-- Collective matching and stragglers.
-- The k-th NCCL collective kernel of one name on every rank of a communicator group (same
-- stage and tp index when the layout is known; all ranks otherwise) is one collective. Only
-- collectives seen on every rank of the group, inside every rank's window, count. A rank
-- waits from its own start until the latest start in the group, at most the kernel's length.
-- Reads: gpu_ops, ranks, win, is_p2p, is_comm, binom_tail. Provides:
--   coll(rank, g1, g2, name, start, end, kth, in_win, latest, earliest, n_seen, all_in_win,
--       wait_ns, is_last, group_size)  one row per rank and matched collective kernel
--   coll_last(g1, g2, name, kth, rank)  each collective's last starter: ranks that started last
--       at the same nanosecond are one, the lowest of them (the report must not depend on the
--       order rows are read in), so the waiting it caused is counted once
--   coll_rank(rank, n_coll, nccl_wait_ns, late_count, group_size, wait_caused_ns, median_lateness_ns)
--       per rank: collectives, NCCL waiting, how often it started last (each of ranks that tie
--       counts), the waiting it caused (as coll_last's last starter)
--   stragglers(rank, late_count, collectives, group_size, wait_caused_ns, median_lateness_ns, p_value,
--       share_of_window_pct)  ranks that start last far more often than chance (binomial p < 0.01); who
--                is to blame for the waiting is 57_wait_graph.sql and 59_critical_path.sql's question
CREATE OR REPLACE TABLE coll AS
WITH k AS (
    SELECT o.rank, coalesce(r.stage, 0) AS g1, coalesce(r.tp_index, 0) AS g2, o.name, o.start, o."end",
           row_number() OVER (PARTITION BY o.rank, o.name ORDER BY o.start) AS kth,
           CASE WHEN o.start >= w.w0 AND o.start < w.w1 THEN 1 ELSE 0 END AS in_win
    FROM gpu_ops o JOIN ranks r USING (rank) JOIN win w USING (rank)
    WHERE o.kind = 'kernel' AND o.is_comm AND NOT is_p2p(o.name)
), gsize AS (
    SELECT coalesce(stage, 0) AS g1, coalesce(tp_index, 0) AS g2, count(*) AS n
    FROM ranks WHERE rank IN (SELECT rank FROM win) GROUP BY ALL
), m AS (
    SELECT k.*, max(k.start) OVER c AS latest, min(k.start) OVER c AS earliest,
           count(*) OVER c AS n_seen, min(k.in_win) OVER c AS all_in_win
    FROM k WINDOW c AS (PARTITION BY g1, g2, name, kth)
)
SELECT m.*, least(m.latest - m.start, m."end" - m.start) AS wait_ns,
       (m.start = m.latest AND m.latest > m.earliest) AS is_last, gs.n AS group_size
FROM m JOIN gsize gs USING (g1, g2)
WHERE m.n_seen = gs.n AND gs.n > 1 AND m.all_in_win = 1;

CREATE OR REPLACE TABLE coll_last AS
SELECT g1, g2, name, kth, min(rank) AS rank FROM coll WHERE is_last GROUP BY ALL;

CREATE OR REPLACE TABLE coll_rank AS
WITH caused AS (
    SELECT l.rank, sum(o.wait_ns) AS ns
    FROM coll_last l JOIN coll o
      ON o.g1 = l.g1 AND o.g2 = l.g2 AND o.name = l.name AND o.kth = l.kth AND o.rank <> l.rank
    GROUP BY l.rank
)
SELECT c.rank, count(*) AS n_coll, sum(c.wait_ns) AS nccl_wait_ns,
       sum(CASE WHEN c.is_last THEN 1 ELSE 0 END) AS late_count,
       any_value(c.group_size) AS group_size,
       coalesce(any_value(cs.ns), 0) AS wait_caused_ns,
       median(CASE WHEN c.is_last THEN c.start - c.earliest END) AS median_lateness_ns
FROM coll c LEFT JOIN caused cs USING (rank)
GROUP BY c.rank;

CREATE OR REPLACE VIEW stragglers AS
WITH t AS (SELECT count(*) AS n_ranks, sum(w1 - w0) AS all_ns FROM win),
w AS (SELECT win.rank, (win.w1 - win.w0) AS win_ns, t.n_ranks, t.all_ns FROM win, t),
s AS (
    SELECT c.*, binom_tail(c.late_count, c.n_coll, 1.0 / c.group_size) AS p_value,
           CASE WHEN w.n_ranks > 1 THEN (w.all_ns - w.win_ns) / (w.n_ranks - 1) END AS others_mean_win_ns
    FROM coll_rank c JOIN w USING (rank)
    WHERE c.n_coll > 0 AND c.late_count > 0 AND c.group_size >= 2
)
SELECT rank, late_count, n_coll AS collectives, group_size, wait_caused_ns, median_lateness_ns, p_value,
       coalesce(round(100.0 * wait_caused_ns / ((group_size - 1) * others_mean_win_ns), 2), 0.0) AS share_of_window_pct
FROM s
WHERE p_value < 0.01 AND late_count / n_coll > 1.5 / group_size;
