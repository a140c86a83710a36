-- The loop thread's OS-runtime calls, read once: the gaps (40_gaps.sql) and what the loop
-- thread did in them (45_cpu_state.sql) both look up where it was blocked, and the OS-runtime
-- calls of every thread can be the largest table of a CPU-heavy capture (then a view over the
-- Parquet parts, read at every query: store/views.py). Only ranks with GPU work can have GPU
-- idle gaps: a CPU-only capture's calls are not read here at all.
-- Map: per rank
-- Reads: osrt, loop_thread, step_ops. Provides:
--   loop_osrt(rank INTEGER, start BIGINT, end BIGINT, name VARCHAR)  the loop thread's OS-runtime calls, on
--       the ranks with GPU work
CREATE OR REPLACE TABLE loop_osrt AS
SELECT o.rank, o.start, o."end", o.name
FROM osrt o JOIN loop_thread USING (rank, tid)
WHERE o.rank IN (SELECT DISTINCT rank FROM step_ops);
