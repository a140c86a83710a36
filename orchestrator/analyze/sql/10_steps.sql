-- Steps: which NVTX ranges mark training iterations.
-- Reads: nvtx, params.
-- Provides:
--   step_marks(rank, tid, start, end, text, family)  every NVTX range that looks like a step
--   steps(rank, tid, start, end, step, family)       the chosen step ranges, numbered
--   step_source(family, pattern)                     which family was chosen (one row or none)
--   open_steps(rank, tid, start, end, step, family)  when the job did not complete
--       (params.ended_early), the step it was stopped in and any after it, on every rank: the
--       first step some rank never finished (the lowest of the ranks' last steps). Taken out of
--       `steps`, so that no metric averages them in: a hung step lasts until the time limit, also
--       on a rank that finished it on the CPU while its GPU waited in the collective the rank
--       behind never entered.
--   every_step(rank, tid, start, end, step, family)  steps and open_steps together: every step
--       range a rank began (where it stood when it ended: rank_end, mem_peak)
-- Families, first match wins across the job: 0 = --steps-from REGEX; 1 = numbered names in
-- the spellings real code uses (`step 12`, `Step 12 Start`, `step_12`, `iteration 12`,
-- `train_step 12`); 2 = torch.profiler's `ProfilerStep#12`; 3 = unnumbered repeated names
-- (`train_step`, `training_step`, Lightning's `[...]X.training_step`). Numbers are used when
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
WHERE n.domain_id = 0 AND n."end" > n.start;

CREATE OR REPLACE TABLE step_source AS
SELECT family, first(text ORDER BY rank, start, text) AS pattern FROM step_marks  -- the first one: stable output
WHERE family = (SELECT min(family) FROM (SELECT family FROM step_marks GROUP BY family HAVING count(*) >= 2))
GROUP BY family;

CREATE OR REPLACE TABLE steps AS
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
)
SELECT p.rank, p.tid, p.start, p."end", CASE WHEN u.numbered THEN p.num ELSE p.ordinal END AS step,
       p.family
FROM picked p JOIN uniq u USING (rank);

CREATE OR REPLACE TABLE open_steps AS
WITH cut AS (SELECT min(top) AS step FROM (SELECT max(step) AS top FROM steps GROUP BY rank))
SELECT s.* FROM steps s, params p, cut c WHERE p.ended_early AND s.step >= c.step;

DELETE FROM steps s USING open_steps o WHERE s.rank = o.rank AND s.step = o.step;

CREATE OR REPLACE VIEW every_step AS SELECT * FROM steps UNION ALL BY NAME SELECT * FROM open_steps;
