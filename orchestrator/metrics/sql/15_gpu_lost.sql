-- Ranks whose GPU trace was lost: no kernel, copy or graph replay in the store, while the rank
-- launched GPU work (its CUDA calls say so) or the other ranks of the job kept theirs. nsys
-- writes a rank's kernels only once CUPTI hands it their buffers: a rank killed (SIGKILL, the
-- SIGABRT of NCCL's watchdog) or stopped while one of its kernels still ran keeps its CPU side
-- (NVTX ranges, some CUDA calls) and loses its GPU side. Such a rank is no CPU-only capture,
-- and its peers' waits for it cannot be told from transfers.
-- Reads: ranks, step_ops, cuda_calls. Provides:
--   gpu_lost(rank, launches)  per such rank, the kernel launches its kept CUDA calls show
CREATE OR REPLACE TABLE gpu_lost AS
WITH launched AS (
    SELECT rank, launches FROM cuda_calls
), gpu AS (
    SELECT DISTINCT rank FROM step_ops
)
SELECT r.rank, coalesce(l.launches, 0) AS launches
FROM ranks r LEFT JOIN launched l USING (rank)
WHERE r.status IN ('ok', 'partial') AND r.rank NOT IN (SELECT rank FROM gpu)
  AND (l.launches > 0 OR EXISTS (SELECT 1 FROM gpu))
ORDER BY r.rank;
