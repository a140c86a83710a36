-- What the training loop's CPU thread was doing while the GPU idled: blocked in an OS call
-- (OS runtime trace: pthread_cond_wait/poll on the DataLoader's queue, read, sleep...) or
-- running Python (no blocking call traced).
-- Reads: loop_osrt, osrt, gap_attr, ranks (untraced), overlapping. Provides:
--   gap_cpu(rank, range_group, call, ns)   per gap group, time the loop thread spent in each
--       OS call inside those gaps (call NULL: the rest, when it was not blocked)
--   osrt_traced(rank)                      ranks with GPU idle gaps whose capture traced the OS
--       runtime (the calls are not read for a capture without such gaps: a CPU-only one)
CREATE OR REPLACE TABLE osrt_traced AS
SELECT rank FROM ranks WHERE NOT regexp_matches(coalesce(untraced, ''), '(^|[ ,])osrt([ ,]|$)')
  AND rank IN (SELECT DISTINCT rank FROM osrt WHERE rank IN (SELECT rank FROM gap_attr));

CREATE OR REPLACE TABLE gap_cpu AS
WITH blocked AS (  -- gaps never overlap each other: overlapping() finds the calls in each
    SELECT g.rank, g.range_group, o.name AS call, sum(least(o."end", o.d_e) - greatest(o.start, o.d_s)) AS ns
    FROM overlapping('gap_attr', 'loop_osrt') o JOIN gap_attr g ON g.rank = o.rank AND g.s = o.d_s
    GROUP BY ALL
), total AS (
    SELECT rank, range_group, sum(dur) AS ns FROM gap_attr WHERE rank IN (SELECT rank FROM osrt_traced) GROUP BY ALL
)
SELECT rank, range_group, call, ns FROM blocked
UNION ALL
SELECT t.rank, t.range_group, NULL, greatest(t.ns - coalesce(sum(b.ns), 0), 0)
FROM total t LEFT JOIN blocked b USING (rank, range_group) GROUP BY t.rank, t.range_group, t.ns;
