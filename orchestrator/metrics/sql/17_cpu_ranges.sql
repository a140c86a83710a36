-- The user's CPU ranges that are not steps: what a GPU idle gap is attributed to (40_gaps.sql)
-- and the CPU phases are made of (80_cpu_phases.sql), on every rank.
-- Reads: nvtx, steps. Provides:
--   cpu_ranges(nvtx_row, rank, tid, start, end, depth)  default-domain ranges (with a name) that
--       are not steps; nvtx_row = the range's rowid in nvtx: its name is read back only for the few
--       ranges a result names (a million names copied here took 40 % of this table's time)
-- A range holds a step when the earliest-ending step that starts at or after it ends inside
-- it: one ASOF join per range (not every range against every step of its thread).
CREATE OR REPLACE TABLE cpu_ranges AS
WITH sm AS (
    SELECT rank, tid, start, min("end") OVER (PARTITION BY rank, tid ORDER BY start DESC
                                              RANGE BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS min_end
    FROM steps
), n AS (
    SELECT rowid AS nvtx_row, rank, tid, start, "end", depth FROM nvtx
    WHERE (domain_id = 0 OR starts_with(text, 'orch: ')) AND text IS NOT NULL
)
SELECT n.* FROM n ASOF LEFT JOIN sm ON sm.rank = n.rank AND sm.tid = n.tid AND n.start <= sm.start
WHERE sm.min_end IS NULL OR n."end" IS NULL OR sm.min_end > n."end";
