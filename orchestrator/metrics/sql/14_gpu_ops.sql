-- GPU work, the CUDA call that launched it, and the step of that launch.
-- Map: per rank (ops_mapped)
-- Reads: kernels, memcpy, memset, graph_execs, cuda_api, steps, is_comm, union_intervals, ranks. Provides:
--   gpu_work_of(want)  the GPU work of the ranks in the list `want` (kernels, copies, memsets,
--       graph replays) from the event tables: gpu_ops' columns up to the name
--   gpu_ops(rank INTEGER, kind VARCHAR, is_comm BOOLEAN, start BIGINT, end BIGINT, correlation_id BIGINT,
--       name VARCHAR, step INTEGER, tid BIGINT, launch BIGINT, graph BOOLEAN)  every GPU op of the ranks at hand
--       tid, launch: the launching CUDA call's thread and start (NULL without one), the one
--       home of the op -> call join (the phase table and the NCCL byte counts read it here)
--       kind 'graph': one CUDA graph replay (graph-level tracing), GPU work like a kernel;
--       graph: the op ran inside a CUDA graph (a replay, or a node kernel whose correlation id
--       is its cudaGraphLaunch's, with --cuda-graph-trace=node)
--   step_ops(rank INTEGER, step INTEGER, n BIGINT, s BIGINT, e BIGINT, compute BIGINT)  per rank and launching
--       step (NULL: launched outside every step): the ops, the first start, the last end, and the
--       time in compute kernels (every kernel but NCCL's; the replay's stage balance weighs the
--       stages by it)
--   _offstep_raw(rank, cls, s, e)  compute kernels launched outside every step (the critical path's
--       `between steps (other work)`)
--   offstep_islands(rank INTEGER, s BIGINT, e BIGINT)  their union
--   comm_ops(rank INTEGER, kind VARCHAR, is_comm BOOLEAN, start BIGINT, end BIGINT, correlation_id BIGINT,
--       name VARCHAR, step INTEGER, tid BIGINT, launch BIGINT, graph BOOLEAN)  the NCCL kernels of gpu_ops:
--       what the files across ranks read (the collectives, p2p, the wait graph, the replay)
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

CREATE OR REPLACE TABLE gpu_ops AS
WITH g AS (SELECT * FROM gpu_work_of((SELECT list(rank) FROM ranks))), launch AS (
    SELECT a.rank, a.correlation_id, arg_min(a.tid, a.start) AS tid, min(a.start) AS launch, max(s.step) AS step,
           bool_or(starts_with(a.name, 'cudaGraphLaunch') OR starts_with(a.name, 'cuGraphLaunch')) AS via_graph
    FROM (SELECT a.rank, a.correlation_id, a.tid, a.start, a.name FROM cuda_api a
          SEMI JOIN g ON g.rank = a.rank AND g.correlation_id = a.correlation_id) a
    LEFT JOIN steps s ON s.rank = a.rank AND a.start >= s.start AND a.start < s."end"
    GROUP BY a.rank, a.correlation_id
)
SELECT g.*, l.step, l.tid, l.launch, g.kind = 'graph' OR coalesce(l.via_graph, false) AS graph FROM g
LEFT JOIN launch l ON l.rank = g.rank AND l.correlation_id = g.correlation_id;

CREATE OR REPLACE TABLE step_ops AS
SELECT rank, step, count(*) AS n, min(start) AS s, max("end") AS e,
       coalesce(sum("end" - start) FILTER (WHERE kind = 'kernel' AND NOT is_comm), 0) AS compute
FROM gpu_ops GROUP BY rank, step;

CREATE OR REPLACE VIEW _offstep_raw AS
SELECT rank, 'b' AS cls, start AS s, "end" AS e FROM gpu_ops
WHERE kind = 'kernel' AND NOT is_comm AND step IS NULL;

CREATE OR REPLACE VIEW offstep_islands AS SELECT rank, s, e FROM union_intervals('_offstep_raw');

CREATE OR REPLACE VIEW comm_ops AS SELECT * FROM gpu_ops WHERE kind = 'kernel' AND is_comm;
