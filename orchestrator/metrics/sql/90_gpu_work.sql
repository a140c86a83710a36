-- GPU work tables the rules read: memory copies and kernel statistics inside the window.
-- Map: per rank
-- Reads: memcpy, gpu_ops, win. Provides:
--   memcpy_window(rank INTEGER, kind VARCHAR, src_kind VARCHAR, n BIGINT, bytes BIGINT, ns BIGINT)  copies by
--       direction and host memory kind
--   kernel_stats(rank INTEGER, n BIGINT, median_ns DOUBLE, n_steps BIGINT)          kernels inside the window
CREATE OR REPLACE TABLE memcpy_window AS
SELECT m.rank, m.kind, m.src_kind, count(*) AS n, sum(m.bytes) AS bytes,
       sum(least(m."end", w.w1) - greatest(m.start, w.w0)) AS ns
FROM memcpy m JOIN win w USING (rank)
WHERE m."end" > w.w0 AND m.start < w.w1 GROUP BY ALL;

CREATE OR REPLACE TABLE kernel_stats AS
SELECT o.rank, count(*) AS n, median(o."end" - o.start) AS median_ns, count(DISTINCT o.step) AS n_steps
FROM gpu_ops o JOIN win w USING (rank)
WHERE o.kind IN ('kernel', 'graph') AND o.start >= w.w0 AND o."end" <= w.w1 GROUP BY o.rank;
