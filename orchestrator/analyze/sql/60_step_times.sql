-- Step time per rank and step: the step's span on the GPU (first start to last end of the
-- work its CPU range launched), every step (the first one included, marked warm-up).
-- Reads: gpu_ops, first_step, params. Provides:
--   step_gpu(rank, step, s, e, ns, warmup)
--   step_stats(rank, mean_ns, median_ns, p90_ns, n)  over the selected (steady-state) steps
CREATE OR REPLACE TEMP TABLE step_gpu AS
SELECT o.rank, o.step, min(o.start) AS s, max(o."end") AS e, (max(o."end") - min(o.start)) AS ns,
       (o.step = any_value(f.first_step)) AS warmup
FROM gpu_ops o JOIN first_step f USING (rank) WHERE o.step IS NOT NULL GROUP BY o.rank, o.step;

CREATE OR REPLACE TEMP VIEW step_stats AS
SELECT g.rank, avg(g.ns) AS mean_ns, median(g.ns) AS median_ns, quantile_cont(g.ns, 0.9) AS p90_ns, count(*) AS n
FROM step_gpu g JOIN first_step f USING (rank), params p
WHERE in_selected(g.step, f.first_step, p.step_lo, p.step_hi)
GROUP BY g.rank;
