-- What the training loop's CPU thread was doing while the GPU idled: blocked in an OS call
-- (OS runtime trace: pthread_cond_wait/poll on the DataLoader's queue, read, sleep...) or
-- running Python (no blocking call traced).
-- A rank's gaps and calls are its own.
-- Where it ran Python, by function: orch's sampler (templates/orch_loop_marks.py.j2) marks each
-- sample of the main thread's stack with an instant NVTX range of domain `orch.py`, named
-- `function (file:line)` in the user's code, then ` | ` and the library's innermost function
-- where the sample was in a library.
-- Map: per rank
-- Reads: loop_osrt, osrt, gap_attr, ranks (untraced), overlapping, nvtx. Provides:
--   gap_cpu(rank INTEGER, range_group VARCHAR, call VARCHAR, ns BIGINT)   per gap group, time the loop thread
--       spent in each OS call inside those gaps (call NULL: the rest, when it was not blocked)
--   osrt_traced(rank INTEGER)                      ranks with GPU idle gaps whose capture traced the OS
--       runtime (the calls are not read for a capture without such gaps: a CPU-only one)
--   gap_python(rank INTEGER, range_group VARCHAR, func VARCHAR, leaf VARCHAR, n BIGINT)  per gap group, the
--       samples taken in its gaps, by function (leaf: the library function under it, or NULL)
CREATE OR REPLACE TABLE osrt_traced AS
SELECT rank FROM ranks
WHERE NOT regexp_matches(coalesce(untraced, ''), '(^|[ ,])osrt([ ,]|$)')
  AND rank IN (SELECT DISTINCT rank FROM osrt WHERE rank IN (SELECT rank FROM gap_attr));

CREATE OR REPLACE TABLE gap_cpu AS
WITH g AS (SELECT * FROM gap_attr),
blocked AS (  -- gaps never overlap each other: overlapping() finds the calls in each
    SELECT g.rank, g.range_group, o.name AS call, sum(least(o."end", o.d_e) - greatest(o.start, o.d_s)) AS ns
    FROM overlapping('g', 'loop_osrt') o JOIN g ON g.rank = o.rank AND g.s = o.d_s
    GROUP BY ALL
), total AS (
    SELECT rank, range_group, sum(dur) AS ns FROM g WHERE rank IN (SELECT rank FROM osrt_traced) GROUP BY ALL
)
SELECT rank, range_group, call, ns FROM blocked
UNION ALL
SELECT t.rank, t.range_group, NULL, greatest(t.ns - coalesce(sum(b.ns), 0), 0)
FROM total t LEFT JOIN blocked b USING (rank, range_group) GROUP BY t.rank, t.range_group, t.ns;

CREATE OR REPLACE TABLE gap_python AS
WITH g AS (SELECT rank, s, e, range_group FROM gap_attr),
py AS (
    SELECT n.rank, n.start, n.text FROM nvtx n
    WHERE n.domain = 'orch.py' AND n.text IS NOT NULL AND n.rank IN (SELECT rank FROM g)
)  -- gaps never overlap: a sample is in the last gap starting at or before it, or in none
SELECT g.rank, g.range_group, split_part(p.text, ' | ', 1) AS func, nullif(split_part(p.text, ' | ', 2), '') AS leaf,
       count(*) AS n
FROM py p ASOF JOIN g ON g.rank = p.rank AND p.start >= g.s
WHERE p.start < g.e
GROUP BY ALL;
