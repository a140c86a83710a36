-- The OS calls across ranks: what the loop thread of one rank waits in that the others' do not,
-- from each rank's API table (98_api_osrt.sql).
-- Reads: api_table, is_thread_wait, loo_ref. Provides:
--   cpu_call_excess(rank, name, ns_per_step, median_ns_per_step, excess_ns_per_step)
--       per rank its (up to 3) OS calls on the main thread whose time per step most exceeds the
--       other ranks' median (loo_ref; a rank with OS calls traced that never makes one counts 0
--       of it): what the loop thread of a rank whose GPU work starts late does that the others do
--       not. Waits for its own threads (is_thread_wait) are left out: a loop thread in
--       pthread_cond_wait during backward waits for the autograd thread's launches
CREATE OR REPLACE TABLE cpu_call_excess AS
WITH m AS (SELECT rank, name, sum(per_step_ns) AS ns FROM api_table
           WHERE api = 'osrt' AND role = 'main' AND NOT is_thread_wait(name) GROUP BY ALL),
rk AS (SELECT DISTINCT rank FROM api_table WHERE api = 'osrt'),
g AS (SELECT rk.rank, nm.name, coalesce(m.ns, 0) AS ns
      FROM rk CROSS JOIN (SELECT DISTINCT name FROM m) nm LEFT JOIN m ON m.rank = rk.rank AND m.name = nm.name),
x AS (SELECT rank, name AS key, ns AS x FROM g),
med AS (SELECT rank, key AS name, ref_med AS ns FROM loo_ref('x'))
SELECT g.rank, g.name, g.ns AS ns_per_step, med.ns AS median_ns_per_step, g.ns - med.ns AS excess_ns_per_step
FROM g JOIN med USING (rank, name)
WHERE g.ns > med.ns
QUALIFY row_number() OVER (PARTITION BY g.rank ORDER BY g.ns - med.ns DESC, g.name) <= 3;
