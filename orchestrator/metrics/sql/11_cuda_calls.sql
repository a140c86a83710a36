-- What needs a rank's CUDA calls alone: how many it made, which thread made most. The map's are
-- taken wherever it ran this SQL: after a job the calls of a rank are read only where no map did
-- it, so the store can leave them in the parts (store/views.py).
-- Map: per rank (map_done)
-- Reads: cuda_api, osrt, threads.
-- Provides:
--   cuda_calls(rank INTEGER, calls BIGINT, launches BIGINT)  per rank with CUDA calls: their number, and the
--       kernel and graph launches among them (cudaLaunch*, cuLaunch*, cudaGraphLaunch*)
--   busy_thread(rank INTEGER, tid BIGINT)  the thread that makes the most CUDA calls, autograd threads
--       (pt_autograd_N) excluded; ties: the lowest tid
--   last_call(rank INTEGER, end_ns BIGINT)  per rank, the end of its last CUDA or OS-runtime call: the last
--       its process was seen alive (63_rank_end.sql)
CREATE OR REPLACE TABLE cuda_calls AS
SELECT rank, count(*) AS calls,
       count(*) FILTER (WHERE name LIKE 'cudaLaunch%' OR name LIKE 'cuLaunch%' OR name LIKE 'cudaGraphLaunch%')
           AS launches
FROM cuda_api GROUP BY rank;

CREATE OR REPLACE TABLE busy_thread AS
SELECT rank, tid FROM (
    SELECT a.rank, a.tid, row_number() OVER (PARTITION BY a.rank ORDER BY count(*) DESC, a.tid) AS i
    FROM cuda_api a LEFT JOIN threads t ON t.rank = a.rank AND t.tid = a.tid
    WHERE coalesce(t.name, '') NOT LIKE 'pt_autograd%'
    GROUP BY a.rank, a.tid)
WHERE i = 1;

CREATE OR REPLACE TABLE last_call AS
SELECT rank, max("end") AS end_ns FROM (
    SELECT rank, "end" FROM cuda_api UNION ALL SELECT rank, "end" FROM osrt)
GROUP BY rank;
