-- What needs a rank's CUDA calls alone: how many it made, which thread made most. The map's
-- (map_done) are taken: after a job the calls of a rank are read only where no map did it, so the
-- store can leave them in the parts (store/views.py).
-- Reads: cuda_api, osrt, threads, map_done, map_none, map_cuda_calls, map_busy_thread, map_last_call.
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
FROM cuda_api SEMI JOIN map_none USING (rank) GROUP BY rank
UNION ALL
SELECT * FROM map_cuda_calls SEMI JOIN map_done USING (rank);

CREATE OR REPLACE TABLE busy_thread AS
SELECT rank, tid FROM (
    SELECT a.rank, a.tid, row_number() OVER (PARTITION BY a.rank ORDER BY count(*) DESC, a.tid) AS i
    FROM (SELECT * FROM cuda_api SEMI JOIN map_none USING (rank)) a
    LEFT JOIN (SELECT * FROM threads SEMI JOIN map_none USING (rank)) t ON t.rank = a.rank AND t.tid = a.tid
    WHERE coalesce(t.name, '') NOT LIKE 'pt_autograd%'
    GROUP BY a.rank, a.tid)
WHERE i = 1
UNION ALL
SELECT * FROM map_busy_thread SEMI JOIN map_done USING (rank);

CREATE OR REPLACE TABLE last_call AS
SELECT rank, max("end") AS end_ns FROM (
    SELECT rank, "end" FROM cuda_api SEMI JOIN map_none USING (rank)
    UNION ALL SELECT rank, "end" FROM osrt SEMI JOIN map_none USING (rank))
GROUP BY rank
UNION ALL
SELECT m.rank, m.end_ns + d.off FROM map_last_call m JOIN map_done d USING (rank);
