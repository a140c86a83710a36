-- Kernels across ranks, side by side: each rank's rows (94_kernel_rows.sql) against the others'.
-- Reads: kernel_rows, ranks, loo_ref, is_outlier. Provides:
--   kernel_table(rank, name, short_name, cls, origin, n, total_ns, mean_ns, med_ns, min_ns,
--       max_ns, std_ns, n_steps, per_step_ns, pct, median_total_ns, min_total_ns, max_total_ns,
--       n_ranks, outlier)
--       kernel_rows with pct = share of the rank's kernel time; the cross-rank columns
--       compare the per-step total (total without steps)
--   kernel_excess(rank, short_name, n_per_step, median_n_per_step, ns_per_step,
--       median_ns_per_step, excess_ns_per_step)
--       per rank its (up to 3) computing kernels whose time per step most exceeds the other
--       ranks' median (loo_ref; a rank that does not run a kernel counts as 0 of it), with the
--       counts per step. "The other ranks" are those of its pipeline stage where the stage has
--       other profiled ranks (another stage runs other layers: no pace to compare with)
--   kernel_origins(rank, kernels, generated)  per rank: its kernels in the window (a CUDA graph's
--       replay one) and how many of them torch.compile's Inductor generated (origin `generated`)
--   kernel_excess_rank(rank, ns_per_step, median_ns_per_step, excess_ns_per_step)
--       per rank its computing kernels' time per step against the other ranks' median: what a
--       straggler "computing on the GPU" computes more than the others
--   _kernel_per_step(rank, peers, name, short_name, n_per_step, ns_per_step)   every rank x
--       computing kernel, 0 where the rank does not run it; peers: the rank's stage where that
--       has other profiled ranks, else -1 (every rank)
CREATE OR REPLACE TABLE kernel_table AS
WITH t AS (SELECT * FROM kernel_rows), x AS (SELECT rank, name AS key, coalesce(per_step_ns, total_ns) AS x FROM t),
   r AS (SELECT * FROM loo_ref('x')),
   c AS (SELECT name, median(coalesce(per_step_ns, total_ns)) AS median_total_ns,
                min(coalesce(per_step_ns, total_ns)) AS min_total_ns,
                max(coalesce(per_step_ns, total_ns)) AS max_total_ns, count(*) AS n_ranks FROM t GROUP BY name)
SELECT t.*, 100.0 * t.total_ns / sum(t.total_ns) OVER (PARTITION BY t.rank) AS pct,
       c.median_total_ns, c.min_total_ns, c.max_total_ns, c.n_ranks,
       is_outlier(coalesce(t.per_step_ns, t.total_ns), r.ref_med, r.ref_mad) AS outlier
FROM t JOIN c USING (name) LEFT JOIN r ON r.rank = t.rank AND r.key = t.name;

-- Every rank x computing kernel, per step (0 where the rank does not run it).
CREATE OR REPLACE TABLE _kernel_per_step AS
WITH k AS (
    SELECT rank, name, min(short_name) AS short_name, sum(n) AS n, sum(total_ns) AS total_ns
    FROM kernel_table WHERE cls <> 'communication' GROUP BY rank, name
), rk AS (SELECT rank, max(n_steps) AS n_steps FROM kernel_table GROUP BY rank HAVING max(n_steps) > 0),
nm AS (SELECT name, min(short_name) AS short_name FROM k GROUP BY name),
pg AS (
    SELECT rk.rank, CASE WHEN count(*) OVER (PARTITION BY r.stage) > 1 THEN coalesce(r.stage, -1) ELSE -1 END AS peers
    FROM rk LEFT JOIN ranks r USING (rank))
SELECT rk.rank, pg.peers, nm.name, nm.short_name, coalesce(k.n, 0) / rk.n_steps AS n_per_step,
       coalesce(k.total_ns, 0) / rk.n_steps AS ns_per_step
FROM rk JOIN pg USING (rank) CROSS JOIN nm LEFT JOIN k ON k.rank = rk.rank AND k.name = nm.name;

CREATE OR REPLACE TABLE kernel_excess AS
WITH g AS (SELECT *, peers || '/' || name AS key FROM _kernel_per_step),  -- a kernel among the rank's peers
xn AS (SELECT rank, key, n_per_step AS x FROM g),
xt AS (SELECT rank, key, ns_per_step AS x FROM g),
m AS (SELECT n.rank, n.key, n.ref_med AS median_n, t.ref_med AS median_ns
      FROM loo_ref('xn') n JOIN loo_ref('xt') t USING (rank, key))
SELECT g.rank, g.short_name, g.n_per_step, m.median_n AS median_n_per_step, g.ns_per_step,
       m.median_ns AS median_ns_per_step, g.ns_per_step - m.median_ns AS excess_ns_per_step
FROM g JOIN m USING (rank, key)
WHERE g.ns_per_step > m.median_ns
QUALIFY row_number() OVER (PARTITION BY g.rank ORDER BY g.ns_per_step - m.median_ns DESC, g.name) <= 3;

CREATE OR REPLACE TABLE kernel_excess_rank AS
WITH r AS (SELECT rank, peers, sum(ns_per_step) AS ns_per_step FROM _kernel_per_step GROUP BY rank, peers),
x AS (SELECT rank, peers AS key, ns_per_step AS x FROM r),
m AS (SELECT rank, ref_med AS median_ns_per_step FROM loo_ref('x'))
SELECT r.rank, r.ns_per_step, m.median_ns_per_step, r.ns_per_step - m.median_ns_per_step AS excess_ns_per_step
FROM r JOIN m USING (rank);

CREATE OR REPLACE VIEW kernel_origins AS
SELECT rank, sum(n) AS kernels, coalesce(sum(n) FILTER (WHERE origin = 'generated'), 0) AS generated
FROM kernel_rows GROUP BY rank;
