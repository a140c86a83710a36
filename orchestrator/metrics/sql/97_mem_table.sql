-- Memory operations across ranks, side by side: each rank's rows (96_memory_ops.sql) against
-- the others'.
-- Reads: mem_rows, loo_ref, is_outlier. Provides:
--   mem_table(rank, op, host_kind, n, total_ns, mean_ns, med_ns, min_ns, max_ns, std_ns, bytes, mean_bytes,
--       med_bytes, min_bytes, max_bytes, n_steps, per_step_ns, pct, median_total_ns, outlier)
--       op = HtoD / DtoH / DtoD / memset / ... (nsys: `[CUDA memcpy HtoD]`); host_kind = the host
--       side's memory (pageable / pinned / managed; `device` for device-only ops), or `all` for the
--       op's total row (the row nsys prints); ops started inside stats_gpu; pct = share of the
--       rank's memory-op time (all rows); cross-rank columns compare the per-step time
CREATE OR REPLACE TABLE mem_table AS
WITH t AS (SELECT * FROM mem_rows), x AS (SELECT rank, op || '/' || host_kind AS key, coalesce(per_step_ns, total_ns) AS x FROM t),
   r AS (SELECT * FROM loo_ref('x')),
   c AS (SELECT op, host_kind, median(coalesce(per_step_ns, total_ns)) AS median_total_ns FROM t GROUP BY ALL)
SELECT t.* EXCLUDE (is_total),
       100.0 * t.total_ns / sum(CASE WHEN t.is_total = 1 THEN t.total_ns END) OVER (PARTITION BY t.rank) AS pct,
       c.median_total_ns, is_outlier(coalesce(t.per_step_ns, t.total_ns), r.ref_med, r.ref_mad) AS outlier
FROM t JOIN c USING (op, host_kind) LEFT JOIN r ON r.rank = t.rank AND r.key = t.op || '/' || t.host_kind;
