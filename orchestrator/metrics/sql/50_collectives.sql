-- Collective matching and stragglers.
-- The k-th NCCL collective kernel of one name on every rank of a communicator group is one
-- collective. The group: the kernel's NCCL communicator (nccl_kernel_comm, from NCCL's NVTX
-- payload) where every rank's export has it, so a TP group's all-reduces, a stage's DP all-reduce and
-- a job-wide one are told apart whatever the layout; else the layout's (same stage and tp
-- index when the layout is known; all ranks otherwise). Its size: NCCL's own count (at most
-- the ranks with a window: a subset may be profiled), else the ranks the communicator's
-- kernels ran on; a layout group's, its ranks with a window. Only collectives seen on every
-- rank of the group, inside every rank's window, count. A rank waits from its own start until
-- the latest start in the group, at most the kernel's length.
-- Reads: comm_ops, ranks, win, nccl_kernel_comm, nccl_comm_size, is_p2p, is_comm, binom_tail. Provides:
--   coll(rank, grp, name, start, end, kth, in_win, latest, earliest, n_seen, all_in_win,
--       wait_ns, is_last, group_size)  one row per rank and matched collective kernel; grp
--       names the group (`comm <id>` or `stage <s> tp <t>`)
--   coll_last(grp, name, kth, rank)  each collective's last starter: ranks that started last
--       at the same nanosecond are one, the lowest of them (the report must not depend on the
--       order rows are read in), so the waiting it caused is counted once
--   coll_rank(rank, n_coll, nccl_wait_ns, late_count, group_size, wait_caused_ns, median_lateness_ns)
--       per rank: collectives, NCCL waiting, how often it started last (each of ranks that tie
--       counts), the waiting it caused (as coll_last's last starter)
--   stragglers(rank, late_count, collectives, group_size, wait_caused_ns, median_lateness_ns, p_value,
--       share_of_window_pct)  ranks that start last far more often than chance (binomial p < 0.01); who
--                is to blame for the waiting is 57_wait_graph.sql and 59_critical_path.sql's question
CREATE OR REPLACE TABLE coll AS
WITH c0 AS (
    SELECT o.rank, o.name, o.start, o."end", kc.comm
    FROM comm_ops o LEFT JOIN nccl_kernel_comm kc ON kc.rank = o.rank AND kc.start = o.start
    WHERE o.kind = 'kernel' AND o.is_comm AND NOT is_p2p(o.name)
), by_comm AS (  -- communicators only when every rank's export has them (90 % of its kernels): one
    -- rank's export without NCCL's payload would otherwise match with nobody
    SELECT coalesce(bool_and(n_comm >= 0.9 * n), false) AS yes
    FROM (SELECT rank, count(comm) AS n_comm, count(*) AS n FROM c0 GROUP BY rank)
), lg AS (  -- each rank's layout group
    SELECT rank, 'stage ' || coalesce(stage, 0) || ' tp ' || coalesce(tp_index, 0) AS grp FROM ranks
), k0 AS (
    SELECT c.rank, CASE WHEN b.yes THEN c.comm END AS comm,
           CASE WHEN b.yes AND c.comm IS NOT NULL THEN 'comm ' || c.comm ELSE g.grp END AS grp,
           c.name, c.start, c."end",
           CASE WHEN c.start >= w.w0 AND c.start < w.w1 THEN 1 ELSE 0 END AS in_win
    FROM c0 c JOIN lg g USING (rank) JOIN win w USING (rank), by_comm b
), k AS (
    SELECT rank, comm, grp, name, start, "end",
           row_number() OVER (PARTITION BY rank, grp, name ORDER BY start) AS kth, in_win
    FROM k0
), gsize AS (
    SELECT k.grp, least(coalesce(max(s.n_ranks), count(DISTINCT k.rank)), (SELECT count(*) FROM win)) AS n
    FROM k LEFT JOIN nccl_comm_size s USING (comm) WHERE k.comm IS NOT NULL GROUP BY k.grp
    UNION ALL
    SELECT grp, count(*) FROM lg WHERE rank IN (SELECT rank FROM win) GROUP BY grp
), m AS (
    SELECT k.*, max(k.start) OVER c AS latest, min(k.start) OVER c AS earliest,
           count(*) OVER c AS n_seen, min(k.in_win) OVER c AS all_in_win
    FROM k WINDOW c AS (PARTITION BY grp, name, kth)
)
SELECT m.* EXCLUDE (comm), least(m.latest - m.start, m."end" - m.start) AS wait_ns,
       (m.start = m.latest AND m.latest > m.earliest) AS is_last, gs.n AS group_size
FROM m JOIN gsize gs USING (grp)
WHERE m.n_seen = gs.n AND gs.n > 1 AND m.all_in_win = 1;

CREATE OR REPLACE TABLE coll_last AS
SELECT grp, name, kth, min(rank) AS rank FROM coll WHERE is_last GROUP BY ALL;

CREATE OR REPLACE TABLE coll_rank AS
WITH caused AS (
    SELECT l.rank, sum(o.wait_ns) AS ns
    FROM coll_last l JOIN coll o
      ON o.grp = l.grp AND o.name = l.name AND o.kth = l.kth AND o.rank <> l.rank
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
