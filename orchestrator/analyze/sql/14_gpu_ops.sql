-- GPU work, the CUDA call that launched it, and the step of that launch.
-- Reads: kernels, memcpy, memset, graph_execs, cuda_api, steps, is_comm. Provides:
--   gpu_ops(rank, kind, is_comm, start, end, correlation_id, name, step, tid, launch, graph)
--       tid, launch: the launching CUDA call's thread and start (NULL without one), the one
--       home of the op -> call join (the phase table and the NCCL byte counts read it here)
--       kind 'graph': one CUDA graph replay (graph-level tracing), GPU work like a kernel;
--       graph: the op ran inside a CUDA graph (a replay, or a node kernel whose correlation id
--       is its cudaGraphLaunch's, with --cuda-graph-trace=node)
--   first_step(rank, first_step)  each rank's first step (in_selected leaves it out by default)
-- A GPU op belongs to the step during which its CUDA launch happened, on any thread of the
-- rank: backward kernels are launched by the autograd engine's thread (pt_autograd_N) while
-- the loop's thread waits inside its step range.
-- Only the calls that launched GPU work are placed (a quarter of all calls in a DDP capture).
-- One statement: the ops (with their names) are written once, not copied into a second table.
CREATE OR REPLACE TABLE gpu_ops AS
WITH g AS (
    SELECT rank, 'kernel' AS kind, is_comm(short_name) AS is_comm, start, "end", correlation_id, short_name AS name
    FROM kernels
    UNION ALL
    SELECT rank, 'memcpy', false, start, "end", correlation_id, 'memcpy ' || kind FROM memcpy
    UNION ALL
    SELECT rank, 'memset', false, start, "end", correlation_id, 'memset' FROM memset
    UNION ALL
    SELECT rank, 'graph', false, start, "end", correlation_id, 'CUDA graph ' || graph_id FROM graph_execs
), launch AS (
    SELECT a.rank, a.correlation_id, arg_min(a.tid, a.start) AS tid, min(a.start) AS launch, max(s.step) AS step,
           bool_or(starts_with(a.name, 'cudaGraphLaunch') OR starts_with(a.name, 'cuGraphLaunch')) AS via_graph
    FROM (SELECT a.rank, a.correlation_id, a.tid, a.start, a.name FROM cuda_api a
          SEMI JOIN g ON g.rank = a.rank AND g.correlation_id = a.correlation_id) a
    LEFT JOIN steps s ON s.rank = a.rank AND a.start >= s.start AND a.start < s."end"
    GROUP BY a.rank, a.correlation_id
)
SELECT g.*, l.step, l.tid, l.launch, g.kind = 'graph' OR coalesce(l.via_graph, false) AS graph FROM g
LEFT JOIN launch l ON l.rank = g.rank AND l.correlation_id = g.correlation_id;

CREATE OR REPLACE TABLE first_step AS
SELECT rank, min(step) AS first_step FROM steps GROUP BY rank;
