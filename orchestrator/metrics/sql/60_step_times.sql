-- Step time per rank and step: the iteration, from the step's start to the next step's start
-- (so the time between two step ranges, where `for batch in loader` waits for data, counts);
-- the last step ends at its range end or its GPU work's end, whichever is later (`complete` is
-- false: what followed it is unknown, so it stays out of the statistics). Every step, the
-- first one included (marked warm-up). s/e: the span of the step's GPU work.
-- Reads: steps, step_ops, first_step, params, in_selected, gap_attr. Provides:
--   step_gpu(rank, step, s, e, ns, warmup, complete)
--       per rank and step: the GPU span of the ops its CUDA calls launched
--   step_stats(rank, mean_ns, median_ns, p90_ns, n)  over the selected, complete steps
--   oneoff_gaps(rank, step, step_ns, median_ns, range_group, ns)
--       the GPU's idle (gap_attr, by range) in each one-off step: an analysed, complete step
--       over 3 x its rank's median analysed step, where such steps are at most a quarter of them
--       and do not recur at a period (torch.compile's CUDA-graph recording, DDP's first bucket
--       rebuild, a checkpoint in a capture that holds one). What the GPU idles there recurs in no
--       other step: the rules that cost idle leave it out. Three or more such steps each k >= 2
--       steps after the one before (k: the rank's most common spacing of them, held at least
--       twice) are the loop's own pattern (a checkpoint or an evaluation every k steps), which
--       its fix saves every time: not one-off; a long step outside that run (DDP's first
--       iteration before the evaluations) still is.
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

CREATE OR REPLACE TABLE oneoff_gaps AS
WITH one AS (  -- step_stats: the median and count over the same selected, complete steps
    SELECT g.rank, g.step, st.start, g.ns, s.median_ns
    FROM step_gpu g JOIN steps st USING (rank, step) JOIN first_step f USING (rank) JOIN step_stats s USING (rank),
        params p
    WHERE in_selected(g.step, f.first_step, p.step_lo, p.step_hi) AND g.complete AND g.ns > 3 * s.median_ns
    QUALIFY count(*) OVER (PARTITION BY g.rank) <= 0.25 * any_value(s.n) OVER (PARTITION BY g.rank)
), spaced AS (  -- d: steps since the rank's previous long step, d_next: to its next
    SELECT rank, step, step - lag(step) OVER w AS d, lead(step) OVER w - step AS d_next
    FROM one WINDOW w AS (PARTITION BY rank ORDER BY step)
), period AS (  -- the most common spacing (ties: the shorter), held at least twice
    SELECT rank, d AS k FROM spaced WHERE d >= 2 GROUP BY rank, d HAVING count(*) >= 2
    QUALIFY row_number() OVER (PARTITION BY rank ORDER BY count(*) DESC, d) = 1
), periodic AS (
    SELECT s.rank, s.step FROM spaced s JOIN period p USING (rank) WHERE s.d = p.k OR s.d_next = p.k
)
SELECT o.rank, o.step, o.ns AS step_ns, CAST(o.median_ns AS BIGINT) AS median_ns, a.range_group, sum(a.dur) AS ns
FROM (SELECT * FROM one ANTI JOIN periodic USING (rank, step)) o
JOIN gap_attr a ON a.rank = o.rank AND a.s >= o.start AND a.s < o.start + o.ns
GROUP BY ALL;
