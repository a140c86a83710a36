-- Where a rank's CPU blocked on its GPU: every CUDA call of a millisecond or more (a sync waits
-- until the GPU finished what was launched before it; a launch into a full queue until the GPU
-- drained it). The replay (61_replay.sql) bounds each rank's launches by them. One rank's events
-- alone: the map computes it next to the rank's data (store/map_tables.py), taken wherever it ran
-- this SQL, so a report of mapped ranks reads no CUDA call.
-- Shorter calls wait too: a launch into a nearly full queue waits for the GPU a little at a time,
-- and a rank held up by a peer through its collectives spends much of its time between launches
-- so; the replay counts that time as the GPU's, not as the CPU's own (queue_wait).
-- Map: per rank (map_done)
-- Reads: cuda_api, gpu_ops, is_sync_api. Provides:
--   cpu_blocks(rank INTEGER, start BIGINT, end BIGINT, sync BOOLEAN, done BIGINT, lb BIGINT)   one row per
--       blocking call; sync: it waited for the GPU's work (a sync, a copy to the host); done: the end of the
--       last GPU op launched before it (what a sync waits for); lb: the start of the last op up to then that
--       started within 0.1 ms of its launch (the GPU had been waiting for the CPU)
--   queue_wait(rank INTEGER, launch BIGINT, cum BIGINT)   at each NCCL kernel's launch, the time the rank's
--       CUDA calls under a millisecond that ended by then took beyond their API's median on the rank, summed
--       from the capture's start
CREATE OR REPLACE TABLE cpu_blocks AS
WITH c AS (  -- one row per interval (calls on two threads may share one): the report must not
    -- depend on the order rows are read in
    SELECT rank, start, "end", bool_or(is_sync_api(name) OR starts_with(name, 'cudaMemcpy')) AS sync
    FROM cuda_api
    WHERE "end" - start >= 1000000
    GROUP BY rank, start, "end"
), o AS (
    SELECT rank, launch, start, "end" FROM gpu_ops WHERE launch IS NOT NULL
), d AS (  -- ops launched at the same nanosecond (a graph's kernels): the last end
    SELECT c.*, o.e AS done FROM c
    ASOF LEFT JOIN (SELECT rank, launch, max("end") AS e FROM o GROUP BY rank, launch) o
      ON o.rank = c.rank AND o.launch < c.start
)
SELECT d.rank, d.start, d."end", d.sync, d.done, x.start AS lb
FROM d ASOF LEFT JOIN (SELECT DISTINCT rank, start FROM o WHERE start - launch < 100000) x
  ON x.rank = d.rank AND x.start <= d.done;

CREATE OR REPLACE TABLE queue_wait AS
WITH a AS (SELECT rank, name, start, "end" FROM cuda_api),
m AS (SELECT rank, name, median("end" - start) AS med FROM a GROUP BY ALL),
o AS (
    SELECT DISTINCT rank, launch FROM gpu_ops
    WHERE kind = 'kernel' AND is_comm AND launch IS NOT NULL
), x AS (  -- each short call's excess, at the first NCCL launch at or after its end (a sum per
    -- launch, then a running sum over the launches: no running sum over every call)
    SELECT o.rank, o.launch, sum(a."end" - a.start - m.med) AS ns
    FROM a JOIN m USING (rank, name) ASOF JOIN o ON o.rank = a.rank AND o.launch >= a."end"
    WHERE a."end" - a.start < 1000000 AND a."end" - a.start > m.med
    GROUP BY ALL
)
SELECT o.rank, o.launch, coalesce(sum(x.ns) OVER (PARTITION BY o.rank ORDER BY o.launch), 0) AS cum
FROM o LEFT JOIN x USING (rank, launch);
