-- The thread that runs the training loop: the one with the NVTX step ranges, else (no markers,
-- or iterations inferred from a kernel the autograd thread launches) the one that makes the
-- most CUDA calls, autograd threads excluded.
-- Reads: steps, cuda_api, threads.
-- Provides:
--   loop_thread(rank, tid)  the loop's thread per rank
CREATE OR REPLACE TABLE loop_thread AS
WITH from_steps AS (SELECT DISTINCT rank, tid FROM steps WHERE family < 4),
busiest AS (
    SELECT a.rank, a.tid, row_number() OVER (PARTITION BY a.rank ORDER BY count(*) DESC, a.tid) AS i
    FROM cuda_api a LEFT JOIN threads t ON t.rank = a.rank AND t.tid = a.tid
    WHERE coalesce(t.name, '') NOT LIKE 'pt_autograd%'
    GROUP BY a.rank, a.tid
)
SELECT rank, tid FROM from_steps
UNION ALL
SELECT rank, tid FROM busiest WHERE i = 1 AND rank NOT IN (SELECT rank FROM from_steps);
