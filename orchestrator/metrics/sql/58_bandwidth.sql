-- Transfer time and bandwidth per collective and p2p instance, nccl-tests' definitions.
-- transfer = kernel - waiting for the last arrival (coll.wait_ns, p2p_match.wait_ns), so a
-- rank that is merely late never looks like a slow link. Size S (nccl-tests): the buffer for
-- all-reduce/broadcast/reduce/send-recv, all ranks' parts for all-gather and reduce-scatter
-- (NCCL's message size x group size). algbw = S / transfer; busbw = algbw x 2(n-1)/n for
-- all-reduce, (n-1)/n for all-gather/reduce-scatter/all-to-all, 1 for broadcast/reduce/p2p:
-- what each rank's link carried, comparable across sizes and group sizes. GB/s = bytes/ns.
-- Scope: `intra` when every rank of the group (or both p2p peers) is on one host, else `inter`.
-- Reads: coll, p2p_match, comm_bytes, ranks, win, nccl_kind. Provides:
--   comm_groups(grp, n_hosts, ranks)
--       communicator groups (coll.grp): their ranks and how many hosts they span
--   _comm_inst(rank, grp, unit, scope, kind, start, end, wait_ns, group_size, msg_bytes, unit_ranks,
--       transfer_ns, bytes, factor, algbw_gbps, busbw_gbps, bucket)  one row per rank and
--       instance: a collective's group by its id in grp, a p2p pair in unit and unit_ranks
--   comm_kind_table(kind, bucket, scope, n, median_bytes, transfer_ns, median_algbw_gbps,
--                   median_busbw_gbps, p10_busbw_gbps, max_busbw_gbps)
--       per collective kind, size bucket and scope: sizes and bandwidths
--   comm_unit_table(unit, scope, kind, bucket, ranks, n, median_busbw_gbps)   per group / p2p pair
--   comm_scope_table(scope, n, bytes, transfer_ns, wait_ns, share_of_window_pct, median_busbw_gbps)
--       intra- vs inter-node: bytes, transfer and waiting, bandwidth
CREATE OR REPLACE TABLE comm_groups AS
SELECT g.grp, count(DISTINCT r.host) AS n_hosts, string_agg(CAST(r.rank AS VARCHAR), ',' ORDER BY r.rank) AS ranks
FROM (SELECT DISTINCT grp, rank FROM coll) g JOIN ranks r USING (rank) GROUP BY g.grp;

-- The rows carry a group id, not the group's rank list: at 256 ranks that list is a kilobyte of
-- text, which every instance row would hold (the tables below join comm_groups for it). The id
-- is the lowest of the groups with the same ranks, which are one unit.
CREATE OR REPLACE TABLE _comm_inst AS
WITH c AS (
    SELECT c.rank, u.grp, NULL AS unit, CASE WHEN g.n_hosts > 1 THEN 'inter' ELSE 'intra' END AS scope,
           nccl_kind(c.name) AS kind, c.start, c."end", c.wait_ns, c.group_size, b.msg_bytes,
           NULL AS unit_ranks
    FROM coll c JOIN comm_groups g USING (grp)
    JOIN (SELECT grp AS cgrp, min(grp) OVER (PARTITION BY ranks) AS grp FROM comm_groups) u ON u.cgrp = c.grp
    LEFT JOIN comm_bytes b ON b.rank = c.rank AND b.start = c.start
), p AS (
    SELECT m.rank, NULL AS grp, 'p2p ' || least(m.rank, m.peer) || '-' || greatest(m.rank, m.peer) AS unit,
           CASE WHEN ra.host IS DISTINCT FROM rb.host THEN 'inter' ELSE 'intra' END AS scope,
           'send_recv' AS kind, m.start, m."end", m.wait_ns, 2 AS group_size,
           greatest(b.send_bytes, b.recv_bytes) AS msg_bytes,
           least(m.rank, m.peer) || ',' || greatest(m.rank, m.peer) AS unit_ranks
    FROM p2p_match m JOIN ranks ra ON ra.rank = m.rank JOIN ranks rb ON rb.rank = m.peer
    LEFT JOIN comm_bytes b ON b.rank = m.rank AND b.start = m.start
), a AS (SELECT * FROM c UNION ALL SELECT * FROM p), f AS (
    SELECT a.*, greatest(a."end" - a.start - a.wait_ns, 0) AS transfer_ns,
           CASE WHEN kind IN ('all_gather', 'reduce_scatter') THEN msg_bytes * group_size ELSE msg_bytes END AS bytes,
           CASE kind WHEN 'all_reduce' THEN 2.0 * (group_size - 1) / group_size
                     WHEN 'all_gather' THEN 1.0 * (group_size - 1) / group_size
                     WHEN 'reduce_scatter' THEN 1.0 * (group_size - 1) / group_size
                     WHEN 'all_to_all' THEN 1.0 * (group_size - 1) / group_size
                     ELSE 1.0 END AS factor
    FROM a
)
SELECT *, CASE WHEN transfer_ns > 0 THEN bytes / transfer_ns END AS algbw_gbps,
       CASE WHEN transfer_ns > 0 THEN bytes / transfer_ns * factor END AS busbw_gbps,
       CASE WHEN bytes > 0 THEN CAST(pow(2, floor(log2(bytes))) AS BIGINT) END AS bucket
FROM f;

CREATE OR REPLACE TABLE comm_kind_table AS
SELECT kind, bucket, scope, count(*) AS n, median(bytes) AS median_bytes, sum(transfer_ns) AS transfer_ns,
       median(algbw_gbps) AS median_algbw_gbps, median(busbw_gbps) AS median_busbw_gbps,
       quantile_cont(busbw_gbps, 0.1) AS p10_busbw_gbps, max(busbw_gbps) AS max_busbw_gbps
FROM _comm_inst WHERE bytes IS NOT NULL GROUP BY ALL ORDER BY kind, bucket, scope;

CREATE OR REPLACE TABLE comm_unit_table AS
WITH u AS (
    SELECT grp, unit, scope, kind, bucket, any_value(unit_ranks) AS ranks, count(*) AS n,
           median(busbw_gbps) AS median_busbw_gbps
    FROM _comm_inst WHERE bytes IS NOT NULL GROUP BY ALL
)
SELECT coalesce('group ' || g.ranks, u.unit) AS unit, u.scope, u.kind, u.bucket, coalesce(g.ranks, u.ranks) AS ranks,
       u.n, u.median_busbw_gbps
FROM u LEFT JOIN comm_groups g USING (grp) ORDER BY unit, kind, bucket;

CREATE OR REPLACE TABLE comm_scope_table AS
WITH per_rank AS (
    SELECT i.scope, i.rank, count(*) AS n, sum(i.bytes) AS bytes, sum(i.transfer_ns) AS transfer_ns,
           sum(i.wait_ns) AS wait_ns, any_value(w.w1 - w.w0) AS win_ns
    FROM _comm_inst i JOIN win w USING (rank) GROUP BY ALL
)
SELECT p.scope, sum(p.n) AS n, sum(p.bytes) AS bytes, avg(p.transfer_ns) AS transfer_ns, avg(p.wait_ns) AS wait_ns,
       avg(100.0 * p.transfer_ns / nullif(p.win_ns, 0)) AS share_of_window_pct,
       (SELECT median(busbw_gbps) FROM _comm_inst i WHERE i.scope = p.scope AND i.bytes IS NOT NULL) AS median_busbw_gbps
FROM per_rank p GROUP BY p.scope ORDER BY p.scope;
