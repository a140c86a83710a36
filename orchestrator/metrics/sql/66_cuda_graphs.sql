-- CUDA graph replays in the window, the GPU time they hold, and what the loop thread does
-- between two replays (what is left outside the graphs: eager kernels such as the optimizer
-- step, host syncs, Python). With graph-level tracing a replay is one GPU op whose span
-- includes the idle between its nodes, so its GPU time reads a little higher than the sum of
-- its kernels that node-level tracing (--cuda-graph-trace=node) shows.
-- Map: per rank
-- Reads: gpu_ops, win, gpu_time, loop_thread, cuda_api, steps, first_step, params,
-- is_sync_api, union_length, in_selected, overlapping.
-- Provides:
--   graph_usage(rank INTEGER, replays BIGINT, n_steps BIGINT, graph_level BOOLEAN, graph_busy_ns BIGINT,
--       busy_ns BIGINT, graph_share_pct DOUBLE, eager_kernels BIGINT, eager_kernel_ns BIGINT, top_eager
--       VARCHAR, between_ns BIGINT, launch_ns BIGINT, sync_ns BIGINT, copy_ns BIGINT, other_api_ns BIGINT,
--       python_ns BIGINT, captures BIGINT, capture_steps BIGINT)  per rank whose window holds GPU work run
--       inside CUDA graphs: replays = the rank's cudaGraphLaunch calls in the window (any thread:
--       torch.compile's backward graph is launched by the autograd engine's thread); graph_level: the replays are traced as one row each (graph-level tracing),
--       not as their kernels; graph_share_pct = graph GPU time (union) over all GPU busy time; eager_* =
--       kernels outside graphs (top_eager: the three with the most time); between_ns = the time from the end
--       of one graph launch to the next (any thread), split by what the loop thread was in: kernel launches,
--       host syncs, copies, other CUDA calls, and no CUDA call at all (python_ns: Python, or waiting in
--       backward() for the autograd engine); captures = the graphs recorded in the window (stream captures
--       begun: torch.compile's CUDA graph trees record one for each new input shape, after a warm-up run of
--       it), capture_steps = the selected steps they began in
--   graph_eager_steps(rank INTEGER, step INTEGER)  per rank whose graphs are recorded in 3 or more of its
--       selected steps (recording recurs: a new graph for each new input shape), the selected steps that
--       replay no graph or begin a capture: the model runs eagerly there (CUDA graph trees warm a new shape up
--       eagerly, then record it, synchronising around both), so the GPU idle of those steps is the recording's
--   _graph_clipped(rank, cls, s, e, kind)  GPU ops run inside CUDA graphs, clipped to the window
--   _graph_calls(rank, start, end, capture)  the graph launch calls (capture false) and stream captures
--       begun (true) in the window, on the ranks with graph work
--   _graph_steps(rank, step, replays, captures)  per selected step of those ranks: the graph launches and the
--       stream captures begun in it
--   _graph_launch_gaps(rank, s, e)  from the end of each graph launch to the next
--   _graph_loop_calls(rank, start, end, what)  the loop thread's CUDA calls between graph launches
CREATE OR REPLACE TABLE _graph_clipped AS
SELECT o.rank, 'graph' AS cls, greatest(o.start, w.w0) AS s, least(o."end", w.w1) AS e, o.kind
FROM gpu_ops o JOIN win w USING (rank)
WHERE o.graph AND o."end" > w.w0 AND o.start < w.w1;

CREATE OR REPLACE TABLE _graph_calls AS  -- the CUDA calls are read once, and only on ranks with graphs
SELECT a.rank, a.start, a."end",  -- (and -1: map_todo in 21_stats_scope.sql says why)
       starts_with(a.name, 'cudaStreamBeginCapture') OR starts_with(a.name, 'cuStreamBeginCapture') AS capture
FROM cuda_api a JOIN win w USING (rank)
WHERE a.rank IN (SELECT rank FROM _graph_clipped UNION ALL SELECT -1)
  AND (starts_with(a.name, 'cudaGraphLaunch') OR starts_with(a.name, 'cuGraphLaunch')
       OR starts_with(a.name, 'cudaStreamBeginCapture') OR starts_with(a.name, 'cuStreamBeginCapture'))
  AND a.start >= w.w0 AND a.start < w.w1;

CREATE OR REPLACE TABLE _graph_steps AS
WITH sel AS (
    SELECT s.rank, s.step, min(s.start) AS s0, max(s."end") AS s1
    FROM steps s JOIN first_step f USING (rank), params p
    WHERE s.rank IN (SELECT rank FROM _graph_calls) AND in_selected(s.step, f.first_step, p.step_lo, p.step_hi)
    GROUP BY s.rank, s.step
)
SELECT s.rank, s.step, count(c.rank) FILTER (WHERE NOT c.capture) AS replays,
       count(c.rank) FILTER (WHERE c.capture) AS captures
FROM sel s LEFT JOIN _graph_calls c ON c.rank = s.rank AND c.start >= s.s0 AND c.start < s.s1
GROUP BY s.rank, s.step;

CREATE OR REPLACE TABLE _graph_launch_gaps AS  -- from the end of each graph launch to the next
SELECT rank, s, e FROM (
    SELECT rank, "end" AS s, lead(start) OVER (PARTITION BY rank ORDER BY start) AS e
    FROM _graph_calls WHERE NOT capture)
WHERE e > s;

CREATE OR REPLACE TABLE _graph_loop_calls AS  -- the loop thread's CUDA calls between graph launches
SELECT a.rank, a.start, a."end",
       CASE WHEN is_sync_api(a.name) THEN 'sync'
            WHEN a.name LIKE '%Launch%' THEN 'launch'
            WHEN a.name LIKE '%emcpy%' OR a.name LIKE '%emset%' THEN 'copy'
            ELSE 'other' END AS what
FROM cuda_api a JOIN loop_thread USING (rank, tid)
WHERE a.rank IN (SELECT rank FROM _graph_launch_gaps);

CREATE OR REPLACE TABLE graph_usage AS
WITH g AS (
    SELECT u.rank, u.ns AS graph_busy_ns, l.graph_level FROM union_length('_graph_clipped') u
    JOIN (SELECT rank, bool_or(kind = 'graph') AS graph_level FROM _graph_clipped GROUP BY rank) l USING (rank)
), replays AS (
    SELECT rank, count(*) FILTER (WHERE NOT capture) AS replays, count(*) FILTER (WHERE capture) AS captures
    FROM _graph_calls GROUP BY rank
), capture_steps AS (
    SELECT rank, count(*) FILTER (WHERE captures > 0) AS capture_steps FROM _graph_steps GROUP BY rank
), n_steps AS (
    SELECT s.rank, count(DISTINCT s.step) AS n_steps FROM steps s JOIN first_step f USING (rank), params p
    WHERE in_selected(s.step, f.first_step, p.step_lo, p.step_hi) GROUP BY s.rank
), eager AS (
    SELECT rank, sum(n) AS eager_kernels, sum(ns) AS eager_kernel_ns,
           string_agg(name, ', ' ORDER BY ns DESC, name) FILTER (WHERE i <= 3) AS top_eager
    FROM (SELECT *, row_number() OVER (PARTITION BY rank ORDER BY ns DESC, name) AS i FROM (
        SELECT o.rank, o.name, count(*) AS n, sum(least(o."end", w.w1) - greatest(o.start, w.w0)) AS ns
        FROM gpu_ops o JOIN win w USING (rank)
        WHERE o.kind = 'kernel' AND NOT o.graph AND o."end" > w.w0 AND o.start < w.w1
          AND o.rank IN (SELECT rank FROM _graph_clipped)
        GROUP BY o.rank, o.name))
    GROUP BY rank
), between AS (
    SELECT rank, sum(e - s) AS between_ns FROM _graph_launch_gaps GROUP BY rank
), calls AS (  -- the between-launch intervals never overlap: overlapping() pairs them with the calls
    SELECT o.rank, o.what, sum(least(o.d_e, o."end") - greatest(o.d_s, o.start)) AS ns
    FROM overlapping('_graph_launch_gaps', '_graph_loop_calls') o GROUP BY o.rank, o.what
), by_what AS (
    SELECT rank, sum(ns) FILTER (WHERE what = 'launch') AS launch_ns, sum(ns) FILTER (WHERE what = 'sync') AS sync_ns,
           sum(ns) FILTER (WHERE what = 'copy') AS copy_ns, sum(ns) FILTER (WHERE what = 'other') AS other_api_ns,
           sum(ns) AS api_ns
    FROM calls GROUP BY rank
)
SELECT g.rank, coalesce(r.replays, 0) AS replays, n.n_steps, g.graph_level, g.graph_busy_ns, t.busy_ns,
       round(100.0 * g.graph_busy_ns / greatest(t.busy_ns, 1), 2) AS graph_share_pct,
       coalesce(e.eager_kernels, 0) AS eager_kernels, coalesce(e.eager_kernel_ns, 0) AS eager_kernel_ns, e.top_eager,
       coalesce(b.between_ns, 0) AS between_ns, coalesce(c.launch_ns, 0) AS launch_ns,
       coalesce(c.sync_ns, 0) AS sync_ns, coalesce(c.copy_ns, 0) AS copy_ns,
       coalesce(c.other_api_ns, 0) AS other_api_ns,
       greatest(coalesce(b.between_ns, 0) - coalesce(c.api_ns, 0), 0) AS python_ns,
       coalesce(r.captures, 0) AS captures, coalesce(k.capture_steps, 0) AS capture_steps
FROM g JOIN gpu_time t USING (rank) LEFT JOIN replays r USING (rank) LEFT JOIN capture_steps k USING (rank)
LEFT JOIN n_steps n USING (rank)
LEFT JOIN eager e USING (rank) LEFT JOIN between b USING (rank) LEFT JOIN by_what c USING (rank)
WHERE g.graph_busy_ns > 0;

CREATE OR REPLACE TABLE graph_eager_steps AS
SELECT rank, step FROM _graph_steps
WHERE (replays = 0 OR captures > 0)
  AND rank IN (SELECT rank FROM _graph_steps GROUP BY rank HAVING count(*) FILTER (WHERE captures > 0) >= 3);
