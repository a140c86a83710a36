-- Interval unions per rank and class, clipped to the window (gaps-and-islands: a new
-- island starts where an interval begins after every earlier one has ended).
-- Classes: compute kernels, comm (NCCL) kernels, busy (kernels + memcpy + memset), and
-- p2p (NCCL send/recv: pipeline traffic, whose waiting is the pipeline bubble).
CREATE OR REPLACE TEMP TABLE clipped AS
SELECT o.rank, c.cls, greatest(o.start, w.w0) AS s, least(o."end", w.w1) AS e
FROM gpu_ops o JOIN win w USING (rank)
CROSS JOIN (VALUES ('compute'), ('comm'), ('busy'), ('p2p')) c(cls)
WHERE o."end" > w.w0 AND o.start < w.w1
  AND (c.cls = 'busy' OR (o.kind = 'kernel' AND o.category = c.cls)
       OR (c.cls = 'p2p' AND o.category = 'comm' AND regexp_matches(o.name, 'SendRecv|_Send|_Recv')));

CREATE OR REPLACE TEMP TABLE islands AS
WITH m AS (
    SELECT *, max(e) OVER (PARTITION BY rank, cls ORDER BY s, e
                           ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
    FROM clipped
), g AS (
    SELECT *, sum(CASE WHEN prev_end IS NULL OR s > prev_end THEN 1 ELSE 0 END)
              OVER (PARTITION BY rank, cls ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS grp
    FROM m
)
SELECT rank, cls, min(s) AS s, max(e) AS e FROM g GROUP BY rank, cls, grp;

CREATE OR REPLACE TEMP TABLE overlap AS
SELECT a.rank, sum(least(a.e, b.e) - greatest(a.s, b.s)) AS ns
FROM islands a JOIN islands b ON a.rank = b.rank AND a.s < b.e AND b.s < a.e
WHERE a.cls = 'comm' AND b.cls = 'compute'
GROUP BY a.rank;

CREATE OR REPLACE TEMP TABLE rank_metrics AS
WITH u AS (
    SELECT rank,
           sum(CASE WHEN cls = 'compute' THEN e - s ELSE 0 END) AS compute_ns,
           sum(CASE WHEN cls = 'comm' THEN e - s ELSE 0 END) AS comm_ns,
           sum(CASE WHEN cls = 'busy' THEN e - s ELSE 0 END) AS busy_ns,
           sum(CASE WHEN cls = 'p2p' THEN e - s ELSE 0 END) AS p2p_ns
    FROM islands GROUP BY rank
)
SELECT w.rank, w.w0, w.w1, w.source, w.w1 - w.w0 AS window_ns,
       coalesce(u.compute_ns, 0) AS compute_ns, coalesce(u.comm_ns, 0) AS comm_ns,
       coalesce(o.ns, 0) AS overlap_ns, coalesce(u.busy_ns, 0) AS busy_ns, coalesce(u.p2p_ns, 0) AS p2p_ns
FROM win w LEFT JOIN u USING (rank) LEFT JOIN overlap o USING (rank);
