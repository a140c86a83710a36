-- The nsys-stats tables across ranks, part 1: the phase table (`nsys stats -r nvtx_sum` +
-- `nvtx_gpu_proj_sum`, one row per rank and range group), in the scope of 21_stats_scope.sql:
-- each rank's rows (the table across ranks: 93_phase_table.sql).
-- Map: per rank
-- Reads: stats_cpu, nvtx, gpu_ops, range_group, union_length.
-- Provides:
--   phase_inst(rank, tid, start, end, domain_id, depth, grp, gid)  NVTX ranges starting inside
--       stats_cpu; grp = `DOMAIN:` (non-default domains, as
--       nsys names them; not orch's, whose names say `orch: `) || range_group(text); orch's
--       Python samples (domain orch.py) are no phase;
--       gid numbers the groups (integers sort and hash faster than names, for the joins below)
--   phase_ops(rank, gid, s, e, tid, inst)   GPU ops launched (CUDA call start, same thread) inside
--       each range instance: the range's projection onto the GPU
--   phase_rows(rank INTEGER, grp VARCHAR, n BIGINT, total_ns BIGINT, mean_ns DOUBLE, med_ns DOUBLE, min_ns
--       BIGINT, max_ns BIGINT, std_ns DOUBLE, n_steps BIGINT, per_step_ns DOUBLE, gpu_ns BIGINT,
--       gpu_per_step_ns DOUBLE, gpu_ops BIGINT, gpu_span_ns BIGINT)  the per-rank part of phase_table,
--       from phase_inst and phase_ops

CREATE OR REPLACE TABLE phase_inst AS
WITH n AS MATERIALIZED (
    SELECT n.rank, n.tid, n.start, n."end", n.domain_id, n.depth, n.text,
           CASE WHEN n.domain_id <> 0 AND n.domain IS NOT NULL AND n.domain <> 'orch' THEN n.domain || ':' ELSE '' END AS pre
    FROM nvtx n JOIN stats_cpu c USING (rank)
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
FROM cpu LEFT JOIN gpu USING (rank, gid) LEFT JOIN inst USING (rank, gid);
