-- Memory operations across ranks (`cuda_gpu_mem_time_sum` + `cuda_gpu_mem_size_sum` per rank): each
-- rank's rows (side by side: 97_mem_table.sql).
-- Map: per rank
-- Reads: memcpy, memset, stats_gpu. Provides:
--   mem_rows(rank INTEGER, op VARCHAR, host_kind VARCHAR, n BIGINT, total_ns BIGINT, mean_ns DOUBLE, med_ns
--       DOUBLE, min_ns BIGINT, max_ns BIGINT, std_ns DOUBLE, bytes BIGINT, mean_bytes DOUBLE, med_bytes
--       DOUBLE, min_bytes BIGINT, max_bytes BIGINT, n_steps BIGINT, per_step_ns DOUBLE, is_total BIGINT)
--       the rank's own statistics per op and host memory kind, and per op (is_total = 1, host_kind `all`)
CREATE OR REPLACE TABLE mem_rows AS
WITH o AS (
    SELECT m.rank, m.kind AS op,
           CASE WHEN m.kind LIKE '%HtoD' THEN m.src_kind WHEN m.kind LIKE '%DtoH' THEN m.dst_kind
                WHEN m.kind = 'HtoH' THEN m.src_kind ELSE 'device' END AS host_kind,
           m."end" - m.start AS d, m.bytes AS b, g.n_steps
    FROM memcpy m JOIN stats_gpu g USING (rank) WHERE m.start >= g.s AND m.start < g.e
    UNION ALL
    SELECT m.rank, 'memset', 'device', m."end" - m.start, m.bytes, g.n_steps
    FROM memset m JOIN stats_gpu g USING (rank) WHERE m.start >= g.s AND m.start < g.e
)
SELECT rank, op, CASE WHEN grouping(host_kind) = 1 THEN 'all' ELSE coalesce(host_kind, 'unknown') END AS host_kind,
       count(*) AS n, sum(d) AS total_ns, avg(d) AS mean_ns, median(d) AS med_ns, min(d) AS min_ns, max(d) AS max_ns,
       coalesce(stddev_samp(d), 0) AS std_ns, sum(b) AS bytes, avg(b) AS mean_bytes, median(b) AS med_bytes,
       min(b) AS min_bytes, max(b) AS max_bytes, any_value(n_steps) AS n_steps,
       sum(d) / any_value(n_steps) AS per_step_ns, grouping(host_kind) AS is_total
FROM o GROUP BY GROUPING SETS ((rank, op), (rank, op, host_kind));
