-- GPU work tables the rules read: memory copies and kernel statistics inside the window.
-- Reads: memcpy, gpu_ops, win, map_ranks, map_todo, map_memcpy_window, map_kernel_stats. Provides:
--   memcpy_window(rank INTEGER, kind VARCHAR, src_kind VARCHAR, n BIGINT, bytes BIGINT, ns BIGINT)  copies by
--       direction and host memory kind (the map's for map_ranks)
--   kernel_stats(rank INTEGER, n BIGINT, median_ns DOUBLE, n_steps BIGINT)          kernels inside the window
--       (the map's for map_ranks)
CREATE OR REPLACE TABLE memcpy_window AS
SELECT m.rank, m.kind, m.src_kind, count(*) AS n, sum(m.bytes) AS bytes,
       sum(least(m."end", w.w1) - greatest(m.start, w.w0)) AS ns
FROM (SELECT * FROM memcpy SEMI JOIN map_todo USING (rank)) m JOIN win w USING (rank)
WHERE m."end" > w.w0 AND m.start < w.w1 GROUP BY ALL
UNION ALL BY NAME
SELECT * FROM map_memcpy_window SEMI JOIN map_ranks USING (rank);

CREATE OR REPLACE TABLE kernel_stats AS
SELECT o.rank, count(*) AS n, median(o."end" - o.start) AS median_ns, count(DISTINCT o.step) AS n_steps
FROM gpu_ops o JOIN (SELECT * FROM win SEMI JOIN map_todo USING (rank)) w USING (rank)
WHERE o.kind IN ('kernel', 'graph') AND o.start >= w.w0 AND o."end" <= w.w1 GROUP BY o.rank
UNION ALL BY NAME
SELECT * FROM map_kernel_stats SEMI JOIN map_ranks USING (rank);
