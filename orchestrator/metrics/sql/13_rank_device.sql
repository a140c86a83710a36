-- The GPU each rank's kernels ran on, which the GPU metrics (62_gpu_metrics.sql) are read for. It
-- needs the rank's kernels alone: the map's where it ran this SQL (map_done, 05_mapped.sql), so
-- that the report reads no mapped rank's kernels for it.
-- Reads: kernels, map_done, map_none, map_rank_device. Provides:
--   rank_device(rank INTEGER, device INTEGER)  the GPU most of a rank's kernels ran on (a tie: the lowest)
CREATE OR REPLACE TABLE rank_device AS
WITH k AS MATERIALIZED (  -- the other ranks' (map_todo in 21_stats_scope.sql says why MATERIALIZED)
    SELECT rank, device, count(*) AS n FROM kernels SEMI JOIN map_none USING (rank) GROUP BY ALL
)
SELECT rank, arg_max(device, (n, -device)) AS device FROM k GROUP BY rank
UNION ALL BY NAME
SELECT * FROM map_rank_device SEMI JOIN map_done USING (rank);
