-- Point-to-point (NCCL send/recv) waiting vs transfer. A send and its recv run as one kernel on
-- each side; the side that starts first waits until its peer starts (a small send may finish
-- before its recv starts: NCCL buffers it). Peers: between two ranks that only talk to each
-- other (a 2-stage pipeline, or a 2-rank job) the k-th send/recv kernel on one is the k-th on
-- the other (both follow the same schedule). With more ranks (a middle stage has two peers)
-- the peer is the overlapping send/recv kernel on an adjacent stage of the same pipeline
-- whose end is closest; kernels with no overlapping peer stay unmatched (no wait counted).
-- Reads: comm_ops, ranks, win, coll, coll_last, is_p2p, is_comm. Provides:
--   p2p_match(rank, start, end, peer, peer_start, wait_ns)   one row per matched kernel
--   p2p_rank(rank, n_p2p, n_matched, p2p_wait_ns)
--       per rank: send/recv kernels, how many matched a peer's, their waiting
--   nccl_waits(rank, s, e, waited_for, kind)   every wait of every rank for another rank:
--       collectives (for the group's last starter: coll_last) and p2p (for the peer). A view:
--       only the HTML's timeline reads it (analyze/timeline.py), so a report without HTML
--       never computes it
--   _p2p_all(rank, stage, dp_index, tp_index, start, end, kth, in_win)
--       every send/recv kernel, numbered per rank
--   _p2p_pairs(rank, peer)  the rank pairs that talk to each other only
-- The send/recv kernels inside the window are `_p2p_all WHERE in_win`.
CREATE OR REPLACE TABLE _p2p_all AS
SELECT o.rank, r.stage, r.dp_index, r.tp_index, o.start, o."end",
       row_number() OVER (PARTITION BY o.rank ORDER BY o.start) AS kth,
       (o."end" > w.w0 AND o.start < w.w1) AS in_win
FROM comm_ops o JOIN ranks r USING (rank) JOIN win w USING (rank)
WHERE o.kind = 'kernel' AND is_p2p(o.name);

-- Ranks with p2p traffic that have exactly one possible peer among the ranks with p2p traffic.
CREATE OR REPLACE TABLE _p2p_pairs AS
WITH rk AS (SELECT DISTINCT rank, stage, dp_index, tp_index FROM _p2p_all),
cand AS (
    SELECT a.rank, b.rank AS peer FROM rk a JOIN rk b ON b.rank <> a.rank
     AND (a.stage IS NULL OR b.stage IS NULL
          OR (abs(a.stage - b.stage) = 1 AND a.dp_index IS NOT DISTINCT FROM b.dp_index
              AND a.tp_index IS NOT DISTINCT FROM b.tp_index))
)
SELECT rank, any_value(peer) AS peer FROM cand GROUP BY rank HAVING count(*) = 1;

CREATE OR REPLACE TABLE p2p_match AS
WITH ops AS (
    SELECT * FROM _p2p_all WHERE in_win
), ordered AS (  -- one peer each way: k-th with k-th
    SELECT a.rank, a.start, a."end", b.rank AS peer, b.start AS peer_start
    FROM ops a JOIN _p2p_pairs p ON p.rank = a.rank
    JOIN _p2p_pairs q ON q.rank = p.peer AND q.peer = a.rank
    JOIN _p2p_all b ON b.rank = p.peer AND b.kth = a.kth
), c AS (
    SELECT a.rank, a.start, a."end", b.rank AS peer, b.start AS peer_start,
           row_number() OVER (PARTITION BY a.rank, a.start ORDER BY abs(a."end" - b."end"), b.rank) AS pick
    FROM ops a JOIN ops b
      ON b.rank <> a.rank AND b.start < a."end" AND a.start < b."end"
     AND a.rank NOT IN (SELECT rank FROM ordered)
     AND (a.stage IS NULL OR b.stage IS NULL
          OR (abs(a.stage - b.stage) = 1 AND a.dp_index IS NOT DISTINCT FROM b.dp_index
              AND a.tp_index IS NOT DISTINCT FROM b.tp_index))
)
SELECT rank, start, "end", peer, peer_start, least(greatest(peer_start - start, 0), "end" - start) AS wait_ns
FROM (SELECT rank, start, "end", peer, peer_start FROM ordered
      UNION ALL SELECT rank, start, "end", peer, peer_start FROM c WHERE pick = 1);

CREATE OR REPLACE TABLE p2p_rank AS
SELECT o.rank, count(*) AS n_p2p, count(m.rank) AS n_matched, coalesce(sum(m.wait_ns), 0) AS p2p_wait_ns
FROM _p2p_all o LEFT JOIN p2p_match m ON m.rank = o.rank AND m.start = o.start
WHERE o.in_win
GROUP BY o.rank;

CREATE OR REPLACE VIEW nccl_waits AS
SELECT c.rank, c.start AS s, c.start + c.wait_ns AS e, l.rank AS waited_for, 'collective' AS kind
FROM coll c JOIN coll_last l ON l.grp = c.grp AND l.name = c.name AND l.kth = c.kth
WHERE c.wait_ns > 0 AND c.rank <> l.rank
UNION ALL
SELECT rank, start, start + wait_ns, peer, 'p2p' FROM p2p_match WHERE wait_ns > 0;
