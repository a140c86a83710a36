-- The nsys-stats tables across ranks, part 1: the phase table (`nsys stats -r nvtx_sum` +
-- `nvtx_gpu_proj_sum`, one row per rank and range group), in the scope of 21_stats_scope.sql.
-- Reads: stats_cpu, stats_cpu_todo, loo_ref, is_outlier, nvtx, gpu_ops, range_group, union_length,
-- map_ranks, map_phase_rows, gpu_lost.
-- Provides:
--   phase_inst(rank, tid, start, end, domain_id, depth, grp, gid)  NVTX ranges starting inside
--       stats_cpu_todo (the ranks not in map_ranks); grp = `DOMAIN:` (non-default domains, as
--       nsys names them; not orch's, whose names say `orch: `) || range_group(text); orch's
--       Python samples (domain orch.py) are no phase;
--       gid numbers the groups (integers sort and hash faster than names, for the joins below)
--   phase_ops(rank, gid, s, e, tid, inst)   GPU ops launched (CUDA call start, same thread) inside
--       each range instance: the range's projection onto the GPU
--   phase_rows(rank INTEGER, grp VARCHAR, n BIGINT, total_ns BIGINT, mean_ns DOUBLE, med_ns DOUBLE, min_ns
--       BIGINT, max_ns BIGINT, std_ns DOUBLE, n_steps BIGINT, per_step_ns DOUBLE, gpu_ns BIGINT,
--       gpu_per_step_ns DOUBLE, gpu_ops BIGINT, gpu_span_ns BIGINT)  the per-rank part of phase_table:
--       computed from phase_inst and phase_ops, and for map_ranks the map's (map_phase_rows)
--   phase_table(rank, grp, n, total_ns, mean_ns, med_ns, min_ns, max_ns, std_ns, n_steps,
--       per_step_ns, gpu_ns, gpu_per_step_ns, gpu_ops, gpu_span_ns, cpu_median_ns, gpu_median_ns,
--       cpu_outlier, gpu_outlier)
--       gpu_ns = union of the projected ops per (rank, grp) (nested same-group ranges and
--       concurrent streams counted once); gpu_span_ns = sum over instances of [first op start,
--       last op end] (what nvtxgpuproj calls the projected duration); *_median_ns = cross-rank
--       median of the per-step value (total without steps)

CREATE OR REPLACE TABLE phase_inst AS
WITH n AS MATERIALIZED (
    SELECT n.rank, n.tid, n.start, n."end", n.domain_id, n.depth, n.text,
           CASE WHEN n.domain_id <> 0 AND n.domain IS NOT NULL AND n.domain <> 'orch' THEN n.domain || ':' ELSE '' END AS pre
    FROM nvtx n JOIN stats_cpu_todo c USING (rank)
    WHERE n.text IS NOT NULL AND n."end" IS NOT NULL AND n."end" >= n.start AND n.start >= c.s AND n.start < c.e
      AND n.domain IS DISTINCT FROM 'orch.py'
), names AS (  -- grouped once per distinct name (thousands, for a million ranges)
    SELECT pre, text, grp, CAST(dense_rank() OVER (ORDER BY grp) AS INTEGER) AS gid
    FROM (SELECT pre, text, pre || range_group(text) AS grp FROM (SELECT DISTINCT pre, text FROM n))
)
SELECT n.rank, n.tid, n.start, n."end", n.domain_id, n.depth, m.grp, m.gid
FROM n JOIN names m USING (pre, text);

-- Which ranges enclose each GPU-launching CUDA call of their thread. A join on (rank, tid) with
-- the time test as a residual compares every range with every call of its thread: quadratic in
-- the capture's length. Instead the calls of a thread are numbered by start time (equal starts,
-- e.g. the ops of one graph launch, share a number k); the calls inside a range [start, end)
-- are then the consecutive numbers from the first call at or after its start to the last
-- before its end: two ASOF joins, range() lists them. Linear in the ranges, calls and pairs,
-- for nested and overlapping ranges alike (zero-length ranges enclose nothing: left out).
CREATE OR REPLACE TABLE phase_ops AS
WITH c AS MATERIALIZED (  -- gpu_ops carries its launch (14_gpu_ops.sql)
    SELECT o.rank, o.tid, o.launch AS start, o.start AS s, o."end" AS e,
           dense_rank() OVER (PARTITION BY o.rank, o.tid ORDER BY o.launch) AS k
    FROM gpu_ops o JOIN (SELECT DISTINCT rank, tid FROM phase_inst) t ON t.rank = o.rank AND t.tid = o.tid
    WHERE o.launch IS NOT NULL
), ck AS MATERIALIZED (
    SELECT DISTINCT rank, tid, start, k FROM c
), ks AS (
    SELECT r.rank, r.tid, r.start, r.gid, unnest(range(lo.k, hi.k + 1)) AS k
    FROM phase_inst r
    ASOF JOIN ck lo ON lo.rank = r.rank AND lo.tid = r.tid AND r.start <= lo.start
    ASOF JOIN ck hi ON hi.rank = r.rank AND hi.tid = r.tid AND r."end" > hi.start
    WHERE r."end" > r.start AND lo.k <= hi.k
)
SELECT ks.rank, ks.gid, c.s, c.e, ks.tid, ks.start AS inst
FROM ks JOIN c ON c.rank = ks.rank AND c.tid = ks.tid AND c.k = ks.k;

CREATE OR REPLACE TABLE phase_rows AS
WITH cpu AS (
    SELECT p.rank, p.gid, any_value(p.grp) AS grp, count(*) AS n, sum(p."end" - p.start) AS total_ns,
           avg(p."end" - p.start) AS mean_ns, median(p."end" - p.start) AS med_ns, min(p."end" - p.start) AS min_ns,
           max(p."end" - p.start) AS max_ns, coalesce(stddev_samp(p."end" - p.start), 0) AS std_ns,
           any_value(c.n_steps) AS n_steps
    FROM phase_inst p JOIN stats_cpu c USING (rank) GROUP BY p.rank, p.gid
), po AS (SELECT rank, gid AS cls, s, e FROM phase_ops),
   gpu AS (SELECT rank, cls AS gid, ns AS gpu_ns FROM union_length('po')),
   inst AS (
    SELECT rank, gid, sum(n) AS gpu_ops, sum(span) AS gpu_span_ns FROM (
        SELECT rank, gid, count(*) AS n, max(e) - min(s) AS span FROM phase_ops GROUP BY rank, gid, tid, inst)
    GROUP BY ALL
)
SELECT cpu.* EXCLUDE (gid), cpu.total_ns / cpu.n_steps AS per_step_ns, coalesce(gpu.gpu_ns, 0) AS gpu_ns,
       coalesce(gpu.gpu_ns, 0) / cpu.n_steps AS gpu_per_step_ns, coalesce(inst.gpu_ops, 0) AS gpu_ops,
       coalesce(inst.gpu_span_ns, 0) AS gpu_span_ns
FROM cpu LEFT JOIN gpu USING (rank, gid) LEFT JOIN inst USING (rank, gid)
UNION ALL BY NAME
SELECT * FROM map_phase_rows SEMI JOIN map_ranks USING (rank);

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
