-- Where a rank's CPU blocked on its GPU: every CUDA call of a millisecond or more (a sync waits
-- until the GPU finished what was launched before it; a launch into a full queue until the GPU
-- drained it). The replay (61_replay.sql) bounds each rank's launches by them. One rank's events
-- alone: the map computes it next to the rank's data (store/map_tables.py), so a report of
-- mapped ranks reads no CUDA call.
-- Reads: cuda_api, gpu_ops, is_sync_api, map_done, map_none, map_cpu_blocks. Provides:
--   cpu_blocks(rank, start, end, sync, done, lb)   one row per blocking call; sync: it waited for
--       the GPU's work (a sync, a copy to the host); done: the end of the last GPU op launched
--       before it (what a sync waits for); lb: the start of the last op up to then that started
--       within 0.1 ms of its launch (the GPU had been waiting for the CPU)
CREATE OR REPLACE TABLE cpu_blocks AS
WITH c AS (  -- one row per interval (calls on two threads may share one): the report must not
    -- depend on the order rows are read in
    SELECT rank, start, "end", bool_or(is_sync_api(name) OR starts_with(name, 'cudaMemcpy')) AS sync
    FROM cuda_api SEMI JOIN map_none USING (rank)
    WHERE "end" - start >= 1000000
    GROUP BY rank, start, "end"
), o AS (
    SELECT rank, launch, start, "end" FROM gpu_ops SEMI JOIN map_none USING (rank) WHERE launch IS NOT NULL
), d AS (  -- ops launched at the same nanosecond (a graph's kernels): the last end
    SELECT c.*, o.e AS done FROM c
    ASOF LEFT JOIN (SELECT rank, launch, max("end") AS e FROM o GROUP BY rank, launch) o
      ON o.rank = c.rank AND o.launch < c.start
)
SELECT d.rank, d.start, d."end", d.sync, d.done, x.start AS lb
FROM d ASOF LEFT JOIN (SELECT DISTINCT rank, start FROM o WHERE start - launch < 100000) x
  ON x.rank = d.rank AND x.start <= d.done
UNION ALL
SELECT m.rank, m.start + k.off, m."end" + k.off, m.sync, m.done + k.off, m.lb + k.off
FROM map_cpu_blocks m JOIN map_done k USING (rank);
