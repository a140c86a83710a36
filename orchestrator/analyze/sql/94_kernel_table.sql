-- Kernels across ranks (`nsys stats -r cuda_gpu_kern_sum` per rank, side by side).
-- Reads: kernels, graph_execs, stats_gpu, loo_ref, is_outlier, is_comm. Provides:
--   kernel_class(short_name)  communication (is_comm) / memory (copy, fill, cat, transpose
--       kernels: data movement the copy engines could not do) / compute
--   kernel_origin(short_name)  generated (Triton kernels, as torch.compile/Inductor names them:
--       triton_poi_/_red_/_per_/_tem_...) / library (cuBLAS, cuDNN, ATen, NCCL, ...) / graph
--       (one CUDA graph replay, `CUDA graph <id>`, with graph-level tracing: its kernels have no rows)
--   kernel_table(rank, name, short_name, cls, origin, n, total_ns, mean_ns, med_ns, min_ns,
--       max_ns, std_ns, n_steps, per_step_ns, pct, median_total_ns, min_total_ns, max_total_ns,
--       n_ranks, outlier)
--       one row per rank and kernel (demangled name, as nsys groups it; nsys also
--       splits by grid/block) started inside stats_gpu; pct = share of the rank's kernel time;
--       the cross-rank columns compare the per-step total (total without steps)
CREATE OR REPLACE MACRO kernel_class(short_name) AS CASE
    WHEN is_comm(short_name) THEN 'communication'
    WHEN coalesce(regexp_matches(short_name, '(?i)memcpy|memset|copy|fill|catarray|cat_|transpose'), false)
        THEN 'memory'
    ELSE 'compute' END;

CREATE OR REPLACE MACRO kernel_origin(short_name) AS CASE
    WHEN starts_with(short_name, 'CUDA graph ') THEN 'graph'
    WHEN starts_with(short_name, 'triton_') THEN 'generated'
    ELSE 'library' END;

CREATE OR REPLACE TABLE kernel_table AS
WITH k AS (
    SELECT k.rank, coalesce(k.name, k.short_name) AS name, k.short_name, k."end" - k.start AS d, g.n_steps
    FROM kernels k JOIN stats_gpu g USING (rank) WHERE k.start >= g.s AND k.start < g.e
    UNION ALL
    SELECT x.rank, 'CUDA graph ' || x.graph_id, 'CUDA graph ' || x.graph_id, x."end" - x.start, g.n_steps
    FROM graph_execs x JOIN stats_gpu g USING (rank) WHERE x.start >= g.s AND x.start < g.e
), t AS (
    SELECT rank, name, min(short_name) AS short_name, kernel_class(min(short_name)) AS cls,
           kernel_origin(min(short_name)) AS origin, count(*) AS n,
           sum(d) AS total_ns, avg(d) AS mean_ns, median(d) AS med_ns, min(d) AS min_ns, max(d) AS max_ns,
           coalesce(stddev_samp(d), 0) AS std_ns, any_value(n_steps) AS n_steps, sum(d) / any_value(n_steps) AS per_step_ns
    FROM k GROUP BY rank, name
), x AS (SELECT rank, name AS key, coalesce(per_step_ns, total_ns) AS x FROM t),
   r AS (SELECT * FROM loo_ref('x')),
   c AS (SELECT name, median(coalesce(per_step_ns, total_ns)) AS median_total_ns,
                min(coalesce(per_step_ns, total_ns)) AS min_total_ns,
                max(coalesce(per_step_ns, total_ns)) AS max_total_ns, count(*) AS n_ranks FROM t GROUP BY name)
SELECT t.*, 100.0 * t.total_ns / sum(t.total_ns) OVER (PARTITION BY t.rank) AS pct,
       c.median_total_ns, c.min_total_ns, c.max_total_ns, c.n_ranks,
       is_outlier(coalesce(t.per_step_ns, t.total_ns), r.ref_med, r.ref_mad) AS outlier
FROM t JOIN c USING (name) LEFT JOIN r ON r.rank = t.rank AND r.key = t.name;
