-- GPU time per rank by class, as interval unions clipped to the window: a rank's unions need its
-- own GPU ops only. Of a mapped rank's islands only the compute ones are kept, which the critical
-- path reads across ranks, where they are (the parts, store/views.py OWN_MAPPED): what the other
-- classes are read for (the gaps, the slices, the time split) is the map's too.
-- Map: per rank
-- Reads: gpu_ops, win, is_p2p, is_comm, union_intervals, union_length. Provides:
--   islands(rank, cls, s, e, upto)  unions per class of the ranks mapped here: compute (non-NCCL
--       kernels and CUDA graph replays), comm (NCCL kernels), busy (every GPU op), p2p (NCCL
--       send/recv); upto: the class's time on the rank up to the island's end (what any span
--       holds of the class is two lookups: the last island starting before each end)
--   compute_islands(rank INTEGER, s BIGINT, e BIGINT, upto BIGINT)  the compute class of every rank (what a
--       map writes)
--   gpu_time(rank INTEGER, compute_ns BIGINT, comm_ns BIGINT, busy_ns BIGINT, p2p_ns BIGINT, overlap_ns
--       BIGINT) per rank, each class's union inside the window; overlap = compute and comm at once
--   _clipped(rank, cls, s, e)  GPU ops clipped to the window, classed (the unions' input)
CREATE OR REPLACE TABLE _clipped AS
SELECT o.rank, c.cls, greatest(o.start, w.w0) AS s, least(o."end", w.w1) AS e
FROM gpu_ops o JOIN win w USING (rank)
CROSS JOIN (VALUES ('compute'), ('comm'), ('busy'), ('p2p')) c(cls)
WHERE o."end" > w.w0 AND o.start < w.w1
  AND (c.cls = 'busy'
       OR (c.cls = 'compute' AND o.kind IN ('kernel', 'graph') AND NOT o.is_comm)
       OR (c.cls = 'comm' AND o.is_comm)
       OR (c.cls = 'p2p' AND is_p2p(o.name)));

-- upto is summed as DOUBLE, exact for integer sums below 2^53 ns (104 days), and much cheaper
-- than a running sum of HUGEINT.
CREATE OR REPLACE TABLE islands AS
SELECT *, CAST(sum(CAST(e - s AS DOUBLE)) OVER (PARTITION BY rank, cls ORDER BY s ROWS UNBOUNDED PRECEDING)
               AS BIGINT) AS upto
FROM union_intervals('_clipped');

CREATE OR REPLACE VIEW compute_islands AS
SELECT rank, s, e, upto FROM islands WHERE cls = 'compute';

CREATE OR REPLACE TABLE gpu_time AS
WITH u AS (
    SELECT rank,
           sum(CASE WHEN cls = 'compute' THEN e - s ELSE 0 END) AS compute_ns,
           sum(CASE WHEN cls = 'comm' THEN e - s ELSE 0 END) AS comm_ns,
           sum(CASE WHEN cls = 'busy' THEN e - s ELSE 0 END) AS busy_ns,
           sum(CASE WHEN cls = 'p2p' THEN e - s ELSE 0 END) AS p2p_ns
    FROM islands GROUP BY rank
), cc AS (  -- comm and compute islands together, for |comm AND compute| = |comm| + |compute| - |comm OR compute|
    SELECT rank, 'cc' AS cls, s, e FROM islands WHERE cls IN ('comm', 'compute')
), o AS (
    SELECT u.rank, u.compute_ns + u.comm_ns - x.ns AS ns FROM union_length('cc') x JOIN u USING (rank)
)
SELECT w.rank, coalesce(u.compute_ns, 0) AS compute_ns, coalesce(u.comm_ns, 0) AS comm_ns,
       coalesce(u.busy_ns, 0) AS busy_ns, coalesce(u.p2p_ns, 0) AS p2p_ns, coalesce(o.ns, 0) AS overlap_ns
FROM win w LEFT JOIN u USING (rank) LEFT JOIN o USING (rank);
