-- The GPU each rank's kernels ran on, which the GPU metrics (62_gpu_metrics.sql) are read for. It
-- needs the rank's kernels alone: the map's where it ran this SQL, so that the report reads no
-- mapped rank's kernels for it.
-- Map: per rank (map_done)
-- Reads: kernels. Provides:
--   rank_device(rank INTEGER, device INTEGER)  the GPU most of a rank's kernels ran on (a tie: the lowest)
CREATE OR REPLACE TABLE rank_device AS
WITH k AS (SELECT rank, device, count(*) AS n FROM kernels GROUP BY ALL)
SELECT rank, arg_max(device, (n, -device)) AS device FROM k GROUP BY rank;
