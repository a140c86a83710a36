-- The CUDA calls each rank made in its window, what nsys' per-call cost is counted on
-- (67_capture_overhead.sql).
-- Map: per rank
-- Reads: win, cuda_api. Provides:
--   capture_api(rank INTEGER, api_calls BIGINT, launches BIGINT)  per rank, the CUDA calls starting in its
--       window and the kernel and graph launches among them
CREATE OR REPLACE TABLE capture_api AS
SELECT w.rank, count(*) AS api_calls,
       count(*) FILTER (WHERE a.name LIKE 'cudaLaunchKernel%' OR a.name LIKE 'cuLaunchKernel%'
                        OR a.name LIKE 'cudaGraphLaunch%' OR a.name LIKE 'cuGraphLaunch%') AS launches
FROM win w
JOIN cuda_api a ON a.rank = w.rank AND a.start >= w.w0 AND a.start < w.w1
GROUP BY w.rank;
