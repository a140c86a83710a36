-- Memory operations across ranks (`cuda_gpu_mem_time_sum` + `cuda_gpu_mem_size_sum` per rank).
-- Reads: memcpy, memset, stats_gpu_todo, map_mem_rows, map_ranks, loo_ref, is_outlier. Provides:
--   mem_rows(rank INTEGER, op VARCHAR, host_kind VARCHAR, n BIGINT, total_ns BIGINT, mean_ns DOUBLE, med_ns
--       DOUBLE, min_ns BIGINT, max_ns BIGINT, std_ns DOUBLE, bytes BIGINT, mean_bytes DOUBLE, med_bytes
--       DOUBLE, min_bytes BIGINT, max_bytes BIGINT, n_steps BIGINT, per_step_ns DOUBLE, is_total BIGINT)
--       the rank's own statistics per op and host memory kind, and per op (is_total = 1, host_kind `all`),
--       which a map computes (map_mem_rows, taken for map_ranks)
--   mem_table(rank, op, host_kind, n, total_ns, mean_ns, med_ns, min_ns, max_ns, std_ns, bytes, mean_bytes,
--       med_bytes, min_bytes, max_bytes, n_steps, per_step_ns, pct, median_total_ns, outlier)
--       op = HtoD / DtoH / DtoD / memset / ... (nsys: `[CUDA memcpy HtoD]`); host_kind = the host
--       side's memory (pageable / pinned / managed; `device` for device-only ops), or `all` for the
--       op's total row (the row nsys prints); ops started inside stats_gpu; pct = share of the
--       rank's memory-op time (all rows); cross-rank columns compare the per-step time
CREATE OR REPLACE TABLE mem_rows AS
WITH o AS (
    SELECT m.rank, m.kind AS op,
           CASE WHEN m.kind LIKE '%HtoD' THEN m.src_kind WHEN m.kind LIKE '%DtoH' THEN m.dst_kind
                WHEN m.kind = 'HtoH' THEN m.src_kind ELSE 'device' END AS host_kind,
           m."end" - m.start AS d, m.bytes AS b, g.n_steps
    FROM memcpy m JOIN stats_gpu_todo g USING (rank) WHERE m.start >= g.s AND m.start < g.e
    UNION ALL
    SELECT m.rank, 'memset', 'device', m."end" - m.start, m.bytes, g.n_steps
    FROM memset m JOIN stats_gpu_todo g USING (rank) WHERE m.start >= g.s AND m.start < g.e
)
SELECT rank, op, CASE WHEN grouping(host_kind) = 1 THEN 'all' ELSE coalesce(host_kind, 'unknown') END AS host_kind,
       count(*) AS n, sum(d) AS total_ns, avg(d) AS mean_ns, median(d) AS med_ns, min(d) AS min_ns, max(d) AS max_ns,
       coalesce(stddev_samp(d), 0) AS std_ns, sum(b) AS bytes, avg(b) AS mean_bytes, median(b) AS med_bytes,
       min(b) AS min_bytes, max(b) AS max_bytes, any_value(n_steps) AS n_steps,
       sum(d) / any_value(n_steps) AS per_step_ns, grouping(host_kind) AS is_total
FROM o GROUP BY GROUPING SETS ((rank, op), (rank, op, host_kind))
UNION ALL BY NAME
SELECT * FROM map_mem_rows SEMI JOIN map_ranks USING (rank);

CREATE OR REPLACE TABLE mem_table AS
WITH t AS (SELECT * FROM mem_rows), x AS (SELECT rank, op || '/' || host_kind AS key, coalesce(per_step_ns, total_ns) AS x FROM t),
   r AS (SELECT * FROM loo_ref('x')),
   c AS (SELECT op, host_kind, median(coalesce(per_step_ns, total_ns)) AS median_total_ns FROM t GROUP BY ALL)
SELECT t.* EXCLUDE (is_total),
       100.0 * t.total_ns / sum(CASE WHEN t.is_total = 1 THEN t.total_ns END) OVER (PARTITION BY t.rank) AS pct,
       c.median_total_ns, is_outlier(coalesce(t.per_step_ns, t.total_ns), r.ref_med, r.ref_mad) AS outlier
FROM t JOIN c USING (op, host_kind) LEFT JOIN r ON r.rank = t.rank AND r.key = t.op || '/' || t.host_kind;
