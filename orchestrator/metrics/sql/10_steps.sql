-- Steps: which NVTX ranges mark training iterations.
-- Reads: nvtx, params, opt_launch, ranks.
-- Provides:
--   step_marks(rank, tid, start, end, text, family)  every NVTX range that looks like a step
--   step_ranges(rank, tid, start, end, step, family, i, has_opt)  the chosen ranges, numbered;
--       i: their order on the rank; has_opt: the optimizer launched a kernel inside
--   step_accum(rank, k)   ranks whose ranges are micro-batches, k to an optimizer step
--   steps(rank INTEGER, tid BIGINT, start BIGINT, end BIGINT, step INTEGER, family INTEGER)       the steps:
--       the ranges, or with gradient accumulation the optimizer steps they make up
--   step_source(family, pattern)                     which family was chosen (one row or none)
--   open_steps(rank, tid, start, end, step, family)  when the job did not complete
--       (params.ended_early), the step it was stopped in and any after it, on every rank: the
--       first step some rank never finished (the lowest of the ranks' last steps). Taken out of
--       `steps`, so that no metric averages them in: a hung step lasts until the time limit, also
--       on a rank that finished it on the CPU while its GPU waited in the collective the rank
--       behind never entered.
--   every_step(rank, tid, start, end, step, family)  steps and open_steps together: every step
--       range a rank began (where it stood when it ended: rank_end, mem_peak)
--   steps_known(rank, off)  the ranks with steps from their NVTX ranges (off: 0), which need no
--       steps inferred from their CUDA calls (12_inferred_steps.sql)
--   steps_todo(rank)  every other rank, and -1 (map_todo in 21_stats_scope.sql says why)
-- Families, first match wins across the job: 0 = --steps-from REGEX; 1 = numbered names in
-- the spellings real code uses (`step 12`, `Step 12 Start`, `step_12`, `iteration 12`,
-- `train_step 12`); 2 = torch.profiler's `ProfilerStep#12`; 3 = unnumbered repeated names
-- (`train_step`, `training_step`, Lightning's `[...]X.training_step`); 4 = orch's loop marks
-- (templates/orch_loop_marks.py.j2: `orch: optimizer.step` around each optimizer step, in its
-- domain or the default one), a step from one optimizer step's end to the next's, so that
-- gradient accumulation is exact on any loop; 5, where no family matched, is the trace's own
-- period (12_inferred_steps.sql). Numbers are used when
-- they are unique per rank (else steps restart per epoch: numbered by order instead).
-- Each distinct name is matched once (a capture has thousands of names for a million ranges).
CREATE OR REPLACE TABLE step_marks AS
WITH names AS (
    SELECT t.text,
           CASE
               WHEN p.steps_from IS NOT NULL THEN CASE WHEN regexp_matches(t.text, p.steps_from) THEN 0 END
               WHEN regexp_matches(t.text, '(?i)^\s*(?:train(?:ing)?[ _-]*)?(?:step|iteration|iter)[ _#:=-]*\d+(?:[ _-]*(?:start|begin))?\s*$') THEN 1
               WHEN regexp_matches(t.text, '^ProfilerStep#\d+$') THEN 2
               WHEN regexp_matches(t.text, '(?i)(?:^|[.\]: ])(?:train(?:ing)?_step|train_batch|run_training_batch)$') THEN 3
           END AS family
    FROM (SELECT DISTINCT text FROM nvtx WHERE domain_id = 0 AND text IS NOT NULL) t, params p
)
SELECT n.rank, n.tid, n.start, n."end", n.text, m.family
FROM nvtx n JOIN names m ON m.text = n.text AND m.family IS NOT NULL
WHERE n.domain_id = 0 AND n."end" > n.start
UNION ALL
SELECT rank, tid, start, "end", text, 4 FROM (  -- each optimizer step ends the step begun at the previous
    -- one's end; the first, at the loop's first wait for a batch on the same thread
    SELECT o.rank, o.tid, coalesce(lag(o."end") OVER (PARTITION BY o.rank, o.tid ORDER BY o.start), b.first) AS start,
           o."end", o.text
    FROM nvtx o LEFT JOIN (SELECT rank, tid, min(start) AS first FROM nvtx WHERE text = 'orch: next batch'
                           GROUP BY ALL) b USING (rank, tid)
    WHERE o.text = 'orch: optimizer.step' AND o."end" > o.start)
WHERE start < "end";

CREATE OR REPLACE TABLE step_source AS
SELECT family, first(text ORDER BY rank, start, text) AS pattern FROM step_marks  -- the first one: stable output
WHERE family = (SELECT min(family) FROM (SELECT family FROM step_marks GROUP BY family HAVING count(*) >= 2))
GROUP BY family;

CREATE OR REPLACE TABLE step_ranges AS
WITH fam AS (
    SELECT m.* FROM step_marks m JOIN step_source s USING (family)
), thread AS (  -- the thread that drives the loop: the one with the most step ranges
    SELECT rank, tid FROM (
        SELECT rank, tid, row_number() OVER (PARTITION BY rank ORDER BY count(*) DESC, tid) AS i
        FROM fam GROUP BY rank, tid) WHERE i = 1
), picked AS (
    SELECT f.*, TRY_CAST(regexp_extract(f.text, '(\d+)\D*$', 1) AS INTEGER) AS num,
           CAST(row_number() OVER (PARTITION BY f.rank ORDER BY f.start) - 1 AS INTEGER) AS ordinal
    FROM fam f JOIN thread t USING (rank, tid)
), uniq AS (
    SELECT rank, count(DISTINCT num) = count(*) AND count(num) = count(*) AS numbered FROM picked GROUP BY rank
), hit AS (
    SELECT DISTINCT p.rank, p.ordinal
    FROM picked p JOIN opt_launch o ON o.rank = p.rank AND o.start >= p.start AND o.start < p."end"
)
SELECT p.rank, p.tid, p.start, p."end", CASE WHEN u.numbered THEN p.num ELSE p.ordinal END AS step,
       p.family, p.ordinal AS i, h.rank IS NOT NULL AS has_opt
FROM picked p JOIN uniq u USING (rank) LEFT JOIN hit h USING (rank, ordinal);

-- Gradient accumulation under NVTX steps: a loop that opens a step range per loader batch and
-- steps the optimizer every k-th batch has k ranges to an optimizer step, as the user counts
-- steps. A rank's ranges are micro-batches when its optimizer kernels fall in 3 or more of
-- them, every k >= 2 ranges apart for at least 80 % of the intervals between them (the most
-- common interval is k; ties: the smaller). Its steps are then the optimizer steps: from the
-- range after one optimizer range through the next, numbered 0.. in order (the first takes the
-- ranges from the start); ranges after the last optimizer range, an accumulation the capture
-- did not finish, are no step.
CREATE OR REPLACE TABLE step_accum AS
WITH gaps AS (
    SELECT rank, i - lag(i) OVER (PARTITION BY rank ORDER BY i) AS gap FROM step_ranges WHERE has_opt
), counted AS (
    SELECT rank, gap, count(*) AS n FROM gaps WHERE gap IS NOT NULL GROUP BY ALL
)
SELECT rank, arg_max(gap, (n, -gap)) AS k FROM counted GROUP BY rank
HAVING arg_max(gap, (n, -gap)) >= 2 AND sum(n) >= 2 AND max(n) >= 0.8 * sum(n);

CREATE OR REPLACE TABLE steps AS
WITH g AS (
    SELECT r.*, coalesce(sum(r.has_opt::INTEGER) OVER (PARTITION BY r.rank ORDER BY r.i
                ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS g,
           sum(r.has_opt::INTEGER) OVER (PARTITION BY r.rank) AS n_opt
    FROM step_ranges r WHERE r.rank IN (SELECT rank FROM step_accum)
)
SELECT rank, arg_min(tid, start) AS tid, min(start) AS start, max("end") AS "end", CAST(g AS INTEGER) AS step,
       any_value(family) AS family
FROM g WHERE g < n_opt GROUP BY rank, g
UNION ALL
SELECT rank, tid, start, "end", step, family FROM step_ranges WHERE rank NOT IN (SELECT rank FROM step_accum);

CREATE OR REPLACE TABLE open_steps AS
WITH cut AS (SELECT min(top) AS step FROM (SELECT max(step) AS top FROM steps GROUP BY rank))
SELECT s.* FROM steps s, params p, cut c WHERE p.ended_early AND s.step >= c.step;

DELETE FROM steps s USING open_steps o WHERE s.rank = o.rank AND s.step = o.step;

CREATE OR REPLACE VIEW every_step AS SELECT * FROM steps UNION ALL BY NAME SELECT * FROM open_steps;

CREATE OR REPLACE TABLE steps_known AS SELECT DISTINCT rank, 0 AS off FROM steps;

CREATE OR REPLACE TABLE steps_todo AS
SELECT rank FROM ranks ANTI JOIN steps_known USING (rank) UNION ALL SELECT -1;
