-- The steps, settled (the NVTX ranges' or the inferred ones): each rank's first, and the ranks
-- whose steps are their map's, whose GPU ops per step, NCCL kernels and compute between steps
-- the analysis takes from the map (14_gpu_ops.sql is the map's own SQL for them).
-- Reads: steps, ranks, params, map_done, map_steps.
-- Provides:
--   first_step(rank, first_step)  each rank's first step (in_selected leaves it out by default)
--   ops_mapped(rank, off)  ranks whose map ran this SQL (map_done) over the same steps (the same
--       numbers and bounds on the rank's clock) with the report's options deciding a rank's scope:
--       the map's scope is then the report's too (21_stats_scope.sql, map_ranks), so no per-rank
--       file needs more of their GPU ops than the map's rows
--   ops_todo(rank)  every other rank, and -1 (map_todo in 21_stats_scope.sql says why): the ranks
--       14_gpu_ops.sql computes from their events
CREATE OR REPLACE TABLE first_step AS
SELECT rank, min(step) AS first_step FROM steps GROUP BY rank;

CREATE OR REPLACE TABLE ops_mapped AS
WITH here AS (
    SELECT s.rank, list((s.step, s.tid, s.start - d.off, s."end" - d.off) ORDER BY s.step, s.start) AS l
    FROM steps s JOIN map_done d USING (rank) GROUP BY s.rank
), mapped AS (
    SELECT rank, list((step, tid, start, "end") ORDER BY step, start) AS l
    FROM map_steps SEMI JOIN map_done USING (rank) GROUP BY rank
)
SELECT d.rank, d.off FROM map_done d LEFT JOIN here h USING (rank) LEFT JOIN mapped m USING (rank), params p
WHERE h.l IS NOT DISTINCT FROM m.l AND p.map_options;

CREATE OR REPLACE TABLE ops_todo AS
SELECT rank FROM ranks ANTI JOIN ops_mapped USING (rank) UNION ALL SELECT -1;
