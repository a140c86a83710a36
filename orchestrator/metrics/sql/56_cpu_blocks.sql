-- Where a rank's CPU blocked on its GPU: every CUDA call of a millisecond or more (a sync waits
-- until the GPU finished what was launched before it; a launch into a full queue until the GPU
-- drained it). The replay (61_replay.sql) bounds each rank's launches by them. One rank's events
-- alone: the map computes it next to the rank's data (store/map_tables.py), so a report of
-- mapped ranks reads no CUDA call.
-- Shorter calls wait too: a launch into a nearly full queue waits for the GPU a little at a time,
-- and a rank held up by a peer through its collectives spends much of its time between launches
-- so; the replay counts that time as the GPU's, not as the CPU's own (queue_wait).
-- Reads: cuda_api, gpu_ops, is_sync_api, map_done, map_none, map_cpu_blocks, map_queue_wait. Provides:
--   cpu_blocks(rank, start, end, sync, done, lb)   one row per blocking call; sync: it waited for
--       the GPU's work (a sync, a copy to the host); done: the end of the last GPU op launched
--       before it (what a sync waits for); lb: the start of the last op up to then that started
--       within 0.1 ms of its launch (the GPU had been waiting for the CPU)
--   queue_wait(rank, launch, cum)   at each NCCL kernel's launch, the time the rank's CUDA calls
--       under a millisecond that ended by then took beyond their API's median on the rank, summed
--       from the capture's start
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

CREATE OR REPLACE TABLE queue_wait AS
WITH a AS (SELECT rank, name, start, "end" FROM cuda_api SEMI JOIN map_none USING (rank)),
m AS (SELECT rank, name, median("end" - start) AS med FROM a GROUP BY ALL),
x AS (  -- one row per end (calls on two threads may end together): a sum that does not depend
    -- on the order rows are read in
    SELECT a.rank, a."end" AS t, sum(greatest(a."end" - a.start - m.med, 0)) AS ns
    FROM a JOIN m USING (rank, name) WHERE a."end" - a.start < 1000000
    GROUP BY a.rank, a."end"
), c AS (SELECT rank, t, sum(ns) OVER (PARTITION BY rank ORDER BY t) AS cum FROM x)
SELECT o.rank, o.launch, coalesce(c.cum, 0) AS cum
FROM (SELECT DISTINCT rank, launch FROM gpu_ops SEMI JOIN map_none USING (rank)
      WHERE kind = 'kernel' AND is_comm AND launch IS NOT NULL) o
ASOF LEFT JOIN c ON c.rank = o.rank AND c.t <= o.launch
UNION ALL
SELECT m.rank, m.launch + k.off, m.cum FROM map_queue_wait m JOIN map_done k USING (rank);
