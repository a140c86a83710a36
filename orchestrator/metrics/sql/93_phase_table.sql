-- The nsys-stats tables across ranks, part 1 continued: the phase table, each rank's rows
-- (92_phases.sql) beside the other ranks'.
-- Reads: phase_rows, stats_cpu, loo_ref, is_outlier, gpu_lost. Provides:
--   phase_table(rank, grp, n, total_ns, mean_ns, med_ns, min_ns, max_ns, std_ns, n_steps,
--       per_step_ns, gpu_ns, gpu_per_step_ns, gpu_ops, gpu_span_ns, cpu_median_ns, gpu_median_ns,
--       cpu_outlier, gpu_outlier)
--       gpu_ns = union of the projected ops per (rank, grp) (nested same-group ranges and
--       concurrent streams counted once); gpu_span_ns = sum over instances of [first op start,
--       last op end] (what nvtxgpuproj calls the projected duration); *_median_ns = cross-rank
--       median of the per-step value (total without steps)
CREATE OR REPLACE TABLE phase_table AS
WITH t AS (SELECT * FROM phase_rows),
absent AS (  -- a range a rank never opens costs it nothing: zero is its reference there, so a
    -- range only the slow rank has (an extra evaluation, a hang) is an outlier on that rank
    SELECT c.rank, g.grp FROM stats_cpu c CROSS JOIN (SELECT DISTINCT grp FROM t) g
    ANTI JOIN t ON t.rank = c.rank AND t.grp = g.grp
), xc AS (SELECT rank, grp AS key, coalesce(per_step_ns, total_ns) AS x FROM t
          UNION ALL SELECT rank, grp, 0 FROM absent),
   xg AS (  -- a rank whose GPU trace was lost has no GPU side to compare
          SELECT rank, grp AS key, coalesce(gpu_per_step_ns, gpu_ns) AS x FROM t
          UNION ALL SELECT rank, grp, 0 FROM absent),
   xg_kept AS (SELECT * FROM xg WHERE rank NOT IN (SELECT rank FROM gpu_lost)),
   rc AS (SELECT * FROM loo_ref('xc')), rg AS (SELECT * FROM loo_ref('xg_kept')),
   med AS (SELECT grp, median(coalesce(per_step_ns, total_ns)) AS cpu_median_ns,
                  median(coalesce(gpu_per_step_ns, gpu_ns)) FILTER (WHERE rank NOT IN (SELECT rank FROM gpu_lost))
                      AS gpu_median_ns FROM t GROUP BY grp)
SELECT t.*, med.cpu_median_ns, med.gpu_median_ns,
       is_outlier(coalesce(t.per_step_ns, t.total_ns), rc.ref_med, rc.ref_mad) AS cpu_outlier,
       is_outlier(coalesce(t.gpu_per_step_ns, t.gpu_ns), rg.ref_med, rg.ref_mad) AS gpu_outlier
FROM t JOIN med USING (grp)
LEFT JOIN rc ON rc.rank = t.rank AND rc.key = t.grp
LEFT JOIN rg ON rg.rank = t.rank AND rg.key = t.grp;
