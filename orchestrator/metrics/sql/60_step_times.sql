-- Step time per rank and step: the iteration, from the step's start to the next step's start
-- (so the time between two step ranges, where `for batch in loader` waits for data, counts);
-- the last step ends at its range end or its GPU work's end, whichever is later (`complete` is
-- false: what followed it is unknown, so it stays out of the statistics). Every step, the
-- first one included (marked warm-up). s/e: the span of the step's GPU work.
-- Reads: steps, step_ops, first_step, params, in_selected, gap_attr. Provides:
--   step_gpu(rank, step, s, e, ns, warmup, complete)
--       per rank and step: the GPU span of the ops its CUDA calls launched
--   step_stats(rank, mean_ns, median_ns, p90_ns, n)  over the selected, complete steps
--   analysed_steps(rank, step, start, ns, median_ns, n, oneoff)  every analysed, complete step of
--       each rank (step_stats' own), with its rank's median and count, and whether it is a one-off
--       step: over 3 x that median, where such steps are at most a quarter of them and do not
--       recur at a period (torch.compile's CUDA-graph recording, DDP's first bucket rebuild, a
--       checkpoint in a capture that holds one). Three or more such steps each k >= 2 steps after
--       the one before (k: the rank's most common spacing of them, held at least twice) are the
--       loop's own pattern (a checkpoint or an evaluation every k steps), which its fix saves
--       every time: not one-off; a long step outside that run (DDP's first iteration before the
--       evaluations) still is. A run's pace leaves the one-off steps out (the report's steps,
--       `orch diff`)
--   oneoff_gaps(rank, step, step_ns, median_ns, range_group, ns, init)
--       the GPU's idle (gap_attr, by range) in each one-off step (analysed_steps). What the GPU
--       idles there recurs in no other step: the rules that cost idle leave it out. init: the
--       idle, in any other analysed step,
--       while the loop thread was in a one-time initialisation (40_gaps.sql names the gap by it):
--       NCCL creating a communicator (at a process group's first collective: a Trainer's first
--       logging all_gather) or CUDA loading a kernel's module at its first launch. Once it is in
--       more than a quarter of the steps it is the loop's own (a new group every step): not one-off.
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

CREATE OR REPLACE TABLE analysed_steps AS
WITH sel AS (  -- the analysed, complete steps (step_stats' own), with their rank's median and count
    SELECT g.rank, g.step, st.start, g.ns, s.median_ns, s.n
    FROM step_gpu g JOIN steps st USING (rank, step) JOIN first_step f USING (rank) JOIN step_stats s USING (rank),
        params p
    WHERE in_selected(g.step, f.first_step, p.step_lo, p.step_hi) AND g.complete
), one AS (
    SELECT * FROM sel WHERE ns > 3 * median_ns
    QUALIFY count(*) OVER (PARTITION BY rank) <= 0.25 * any_value(n) OVER (PARTITION BY rank)
), spaced AS (  -- d: steps since the rank's previous long step, d_next: to its next
    SELECT rank, step, step - lag(step) OVER w AS d, lead(step) OVER w - step AS d_next
    FROM one WINDOW w AS (PARTITION BY rank ORDER BY step)
), period AS (  -- the most common spacing (ties: the shorter), held at least twice
    SELECT rank, d AS k FROM spaced WHERE d >= 2 GROUP BY rank, d HAVING count(*) >= 2
    QUALIFY row_number() OVER (PARTITION BY rank ORDER BY count(*) DESC, d) = 1
), periodic AS (
    SELECT s.rank, s.step FROM spaced s JOIN period p USING (rank) WHERE s.d = p.k OR s.d_next = p.k
), long AS (
    SELECT rank, step FROM one ANTI JOIN periodic USING (rank, step)
)
SELECT sel.*, l.step IS NOT NULL AS oneoff FROM sel LEFT JOIN long l USING (rank, step);

CREATE OR REPLACE TABLE oneoff_gaps AS
WITH long AS (
    SELECT * FROM analysed_steps WHERE oneoff
), init AS (  -- the gaps in a one-time initialisation, each in the step it starts in (not a long one-off)
    SELECT s.rank, s.step, s.ns, s.median_ns, s.n, a.range_group, a.dur
    FROM gap_attr a JOIN (SELECT * FROM analysed_steps WHERE NOT oneoff) s
        ON a.rank = s.rank AND a.s >= s.start AND a.s < s.start + s.ns, params p
    WHERE starts_with(a.range_group, p.call_gap)
      AND regexp_matches(a.range_group[length(p.call_gap) + 1:], '^(NCCL:ncclComm(Init|Split)|cuLibraryLoad|cuModuleLoad)')
), init_steps AS (  -- in at most a quarter of the steps: a communicator made every step is the loop's own
    SELECT rank FROM init GROUP BY rank HAVING count(DISTINCT step) <= 0.25 * any_value(n)
)
SELECT o.rank, o.step, o.ns AS step_ns, CAST(o.median_ns AS BIGINT) AS median_ns, a.range_group, sum(a.dur) AS ns,
       false AS init
FROM long o
JOIN gap_attr a ON a.rank = o.rank AND a.s >= o.start AND a.s < o.start + o.ns
GROUP BY ALL
UNION ALL
SELECT rank, step, ns, CAST(median_ns AS BIGINT), range_group, sum(dur), true
FROM init SEMI JOIN init_steps USING (rank)
GROUP BY ALL;
