-- Step time per rank and step: the iteration, from the step's start to the next step's start
-- (so the time between two step ranges, where `for batch in loader` waits for data, counts);
-- the last step ends at its range end or its GPU work's end, whichever is later (`complete` is
-- false: what followed it is unknown, so it stays out of the statistics). Every step, the
-- first one included (marked warm-up). s/e: the span of the step's GPU work.
-- Reads: steps, step_ops, first_step, params, in_selected. Provides:
--   step_gpu(rank, step, s, e, ns, warmup, complete)
--       per rank and step: the GPU span of the ops its CUDA calls launched
--   step_stats(rank, mean_ns, median_ns, p90_ns, n)  over the selected, complete steps
CREATE OR REPLACE TABLE step_gpu AS
WITH g AS (
    SELECT rank, step, s, e FROM step_ops WHERE step IS NOT NULL
), st AS (
    SELECT rank, step, start, "end", lead(start) OVER (PARTITION BY rank ORDER BY start) AS next_start FROM steps
)
SELECT st.rank, st.step, g.s, g.e,
       coalesce(st.next_start, greatest(st."end", coalesce(g.e, st."end"))) - st.start AS ns,
       (st.step = f.first_step) AS warmup, st.next_start IS NOT NULL AS complete
FROM st JOIN first_step f USING (rank) LEFT JOIN g USING (rank, step);

CREATE OR REPLACE VIEW step_stats AS
SELECT g.rank, avg(g.ns) AS mean_ns, median(g.ns) AS median_ns, quantile_cont(g.ns, 0.9) AS p90_ns, count(*) AS n
FROM step_gpu g JOIN first_step f USING (rank), params p
WHERE in_selected(g.step, f.first_step, p.step_lo, p.step_hi) AND g.complete
GROUP BY g.rank;
