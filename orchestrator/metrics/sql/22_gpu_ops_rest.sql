-- The rest of the GPU ops of a rank whose steps are the map's but whose other statistics are
-- not (another window, gap threshold or process: not in map_ranks): every per-rank file
-- computes that rank from gpu_ops, which until here holds only its NCCL kernels. With the
-- default options every such rank is in map_ranks and nothing is read here.
-- Reads: gpu_ops_of, gpu_work_of, kernels, memcpy, memset, graph_execs, cuda_api, steps, ops_mapped,
-- map_ranks.
-- Writes: gpu_ops.
-- Provides:
--   ops_late(rank)  the ops_mapped ranks outside map_ranks: their ops are added to gpu_ops here
--   ops_partial(rank, off)  the other ops_mapped ranks: gpu_ops holds their NCCL kernels only,
--       and each file that needs more of their ops takes the map's rows (map_ranks)
CREATE OR REPLACE TABLE ops_late AS
SELECT rank FROM ops_mapped ANTI JOIN map_ranks USING (rank);

CREATE OR REPLACE TABLE ops_partial AS
SELECT * FROM ops_mapped ANTI JOIN ops_late USING (rank);

INSERT INTO gpu_ops BY NAME
SELECT * FROM gpu_ops_of((SELECT list(rank) FROM ops_late)) WHERE NOT (kind = 'kernel' AND is_comm);
