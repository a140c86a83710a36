-- The thread that runs the training loop: the one with the NVTX step ranges, else (no markers,
-- or iterations inferred from a kernel the autograd thread launches) the one that makes the
-- most CUDA calls, autograd threads excluded.
-- Reads: steps, busy_thread.
-- Provides:
--   loop_thread(rank, tid)  the loop's thread per rank
CREATE OR REPLACE TABLE loop_thread AS
WITH from_steps AS (SELECT DISTINCT rank, tid FROM steps WHERE family < 5)
SELECT rank, tid FROM from_steps
UNION ALL
SELECT rank, tid FROM busy_thread WHERE rank NOT IN (SELECT rank FROM from_steps);
