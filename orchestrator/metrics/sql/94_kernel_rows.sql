-- Kernels across ranks (`nsys stats -r cuda_gpu_kern_sum` per rank, side by side): each rank's rows
-- (side by side: 95_kernel_table.sql).
-- Map: per rank
-- Reads: kernels, graph_execs, stats_gpu, is_comm. Provides:
--   kernel_class(short_name)  communication (is_comm) / memory (copy, fill, cat, transpose
--       kernels: data movement the copy engines could not do) / compute
--   kernel_origin(short_name)  generated (Triton kernels, as torch.compile/Inductor names them:
--       triton_poi_/_red_/_per_/_tem_...) / library (cuBLAS, cuDNN, ATen, NCCL, ...) / graph
--       (one CUDA graph replay, `CUDA graph <id>`, with graph-level tracing: its kernels have no rows)
--   kernel_rows(rank INTEGER, name VARCHAR, short_name VARCHAR, cls VARCHAR, origin VARCHAR, n BIGINT,
--       total_ns BIGINT, mean_ns DOUBLE, med_ns DOUBLE, min_ns BIGINT, max_ns BIGINT, std_ns DOUBLE, n_steps
--       BIGINT, per_step_ns DOUBLE)   one row per rank and kernel (demangled name, as nsys groups it; nsys
--       also splits by grid/block) started inside stats_gpu: the rank's own statistics
CREATE OR REPLACE MACRO kernel_class(short_name) AS CASE
    WHEN is_comm(short_name) THEN 'communication'
    WHEN coalesce(regexp_matches(short_name, '(?i)memcpy|memset|copy|fill|catarray|cat_|transpose'), false)
        THEN 'memory'
    ELSE 'compute' END;

CREATE OR REPLACE MACRO kernel_origin(short_name) AS CASE
    WHEN starts_with(short_name, 'CUDA graph ') THEN 'graph'
    WHEN starts_with(short_name, 'triton_') THEN 'generated'
    ELSE 'library' END;

CREATE OR REPLACE TABLE kernel_rows AS
WITH k AS (
    SELECT k.rank, coalesce(k.name, k.short_name) AS name, k.short_name, k."end" - k.start AS d, g.n_steps
    FROM kernels k JOIN stats_gpu g USING (rank) WHERE k.start >= g.s AND k.start < g.e
    UNION ALL
    SELECT x.rank, 'CUDA graph ' || x.graph_id, 'CUDA graph ' || x.graph_id, x."end" - x.start, g.n_steps
    FROM graph_execs x JOIN stats_gpu g USING (rank) WHERE x.start >= g.s AND x.start < g.e
)
SELECT rank, name, min(short_name) AS short_name, kernel_class(min(short_name)) AS cls,
       kernel_origin(min(short_name)) AS origin, count(*) AS n,
       sum(d) AS total_ns, avg(d) AS mean_ns, median(d) AS med_ns, min(d) AS min_ns, max(d) AS max_ns,
       coalesce(stddev_samp(d), 0) AS std_ns, any_value(n_steps) AS n_steps, sum(d) / any_value(n_steps) AS per_step_ns
FROM k GROUP BY rank, name;
