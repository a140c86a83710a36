-- GPU work, the CUDA call that launched it, and the step of that launch.
-- Reads: kernels, memcpy, memset, graph_execs, cuda_api, steps, is_comm, union_intervals, ranks,
-- map_done, map_steps, map_step_ops, map_comm_ops. Provides:
--   gpu_work_of(want)  the GPU work of the ranks in the list `want` (kernels, copies, memsets,
--       graph replays) from the event tables: gpu_ops' columns up to the name
--   gpu_ops_of(want)  gpu_work_of(want) with each op's launching call and step: the one home of
--       the op -> call join
--   ops_mapped(rank, off)  ranks whose steps are the map's (map_steps): the map's GPU ops per
--       step and NCCL kernels are theirs (05_mapped.sql)
--   ops_todo(rank)  every other rank, and -1 (map_todo in 21_stats_scope.sql says why)
--   gpu_ops(rank, kind, is_comm, start, end, correlation_id, name, step, tid, launch, graph)
--       every GPU op of the ops_todo ranks, and the NCCL kernels (kind 'kernel', is_comm) of
--       the ops_mapped ranks; 22_gpu_ops_rest.sql adds the rest of an ops_mapped rank's ops
--       where its other statistics are not the map's (not in map_ranks)
--       tid, launch: the launching CUDA call's thread and start (NULL without one), the one
--       home of the op -> call join (the phase table and the NCCL byte counts read it here)
--       kind 'graph': one CUDA graph replay (graph-level tracing), GPU work like a kernel;
--       graph: the op ran inside a CUDA graph (a replay, or a node kernel whose correlation id
--       is its cudaGraphLaunch's, with --cuda-graph-trace=node)
--   step_ops(rank INTEGER, step INTEGER, n BIGINT, s BIGINT, e BIGINT)  per rank and launching step (NULL:
--       launched outside every step): the ops, the first start and the last end; every rank's
--   offstep_raw(rank, cls, s, e)  compute kernels launched outside every step (the critical path's
--       `between steps (other work)`), of the ranks gpu_ops has them for
--   offstep_islands(rank INTEGER, s BIGINT, e BIGINT)  their union (what a map writes)
--   comm_ops(rank INTEGER, kind VARCHAR, is_comm BOOLEAN, start BIGINT, end BIGINT, correlation_id BIGINT,
--       name VARCHAR, step INTEGER, tid BIGINT, launch BIGINT, graph BOOLEAN)  the NCCL kernels of gpu_ops
--       (what a map writes)
--   first_step(rank, first_step)  each rank's first step (in_selected leaves it out by default)
-- A GPU op belongs to the step during which its CUDA launch happened, on any thread of the
-- rank: backward kernels are launched by the autograd engine's thread (pt_autograd_N) while
-- the loop's thread waits inside its step range.
-- Only the calls that launched GPU work are placed (a quarter of all calls in a DDP capture).
-- One statement: the ops (with their names) are written once, not copied into a second table.
CREATE OR REPLACE MACRO gpu_work_of(want) AS TABLE
SELECT rank, 'kernel' AS kind, is_comm(short_name) AS is_comm, start, "end", correlation_id, short_name AS name
FROM kernels SEMI JOIN (SELECT unnest(want) AS rank) w USING (rank)
UNION ALL
SELECT rank, 'memcpy', false, start, "end", correlation_id, 'memcpy ' || kind FROM memcpy
SEMI JOIN (SELECT unnest(want) AS rank) w USING (rank)
UNION ALL
SELECT rank, 'memset', false, start, "end", correlation_id, 'memset' FROM memset
SEMI JOIN (SELECT unnest(want) AS rank) w USING (rank)
UNION ALL
SELECT rank, 'graph', false, start, "end", correlation_id, 'CUDA graph ' || graph_id FROM graph_execs
SEMI JOIN (SELECT unnest(want) AS rank) w USING (rank);

CREATE OR REPLACE MACRO gpu_ops_of(want) AS TABLE
WITH g AS (SELECT * FROM gpu_work_of(want)), launch AS (
    SELECT a.rank, a.correlation_id, arg_min(a.tid, a.start) AS tid, min(a.start) AS launch, max(s.step) AS step,
           bool_or(starts_with(a.name, 'cudaGraphLaunch') OR starts_with(a.name, 'cuGraphLaunch')) AS via_graph
    FROM (SELECT a.rank, a.correlation_id, a.tid, a.start, a.name FROM cuda_api a
          SEMI JOIN g ON g.rank = a.rank AND g.correlation_id = a.correlation_id) a
    LEFT JOIN steps s ON s.rank = a.rank AND a.start >= s.start AND a.start < s."end"
    GROUP BY a.rank, a.correlation_id
)
SELECT g.*, l.step, l.tid, l.launch, g.kind = 'graph' OR coalesce(l.via_graph, false) AS graph FROM g
LEFT JOIN launch l ON l.rank = g.rank AND l.correlation_id = g.correlation_id;

-- A step's ops are a function of the rank's events and its steps: where the steps are the map's
-- (the same numbers and bounds, on the rank's clock), so are the ops it summarised.
CREATE OR REPLACE TABLE ops_mapped AS
WITH here AS (
    SELECT s.rank, list((s.step, s.tid, s.start - d.off, s."end" - d.off) ORDER BY s.step, s.start) AS l
    FROM steps s JOIN map_done d USING (rank) GROUP BY s.rank
), mapped AS (
    SELECT rank, list((step, tid, start, "end") ORDER BY step, start) AS l
    FROM map_steps SEMI JOIN map_done USING (rank) GROUP BY rank
)
SELECT d.rank, d.off FROM map_done d LEFT JOIN here h USING (rank) LEFT JOIN mapped m USING (rank)
WHERE h.l IS NOT DISTINCT FROM m.l;

CREATE OR REPLACE TABLE ops_todo AS
SELECT rank FROM ranks ANTI JOIN ops_mapped USING (rank) UNION ALL SELECT -1;

CREATE OR REPLACE TABLE gpu_ops AS
SELECT * FROM gpu_ops_of((SELECT list(rank) FROM ops_todo))
UNION ALL BY NAME
SELECT m.* REPLACE (m.start + k.off AS start, m."end" + k.off AS "end", m.launch + k.off AS launch)
FROM map_comm_ops m JOIN ops_mapped k USING (rank);

CREATE OR REPLACE TABLE step_ops AS
SELECT rank, step, count(*) AS n, min(start) AS s, max("end") AS e
FROM gpu_ops SEMI JOIN ops_todo USING (rank) GROUP BY rank, step
UNION ALL
SELECT m.rank, m.step, m.n, m.s + k.off, m.e + k.off FROM map_step_ops m JOIN ops_mapped k USING (rank);

CREATE OR REPLACE VIEW offstep_raw AS
SELECT rank, 'b' AS cls, start AS s, "end" AS e FROM gpu_ops
WHERE kind = 'kernel' AND NOT is_comm AND step IS NULL;

CREATE OR REPLACE VIEW offstep_islands AS SELECT rank, s, e FROM union_intervals('offstep_raw');

CREATE OR REPLACE VIEW comm_ops AS SELECT * FROM gpu_ops WHERE kind = 'kernel' AND is_comm;

CREATE OR REPLACE TABLE first_step AS
SELECT rank, min(step) AS first_step FROM steps GROUP BY rank;
