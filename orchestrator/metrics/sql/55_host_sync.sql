-- Host syncs: CPU calls that wait for the GPU (what `.item()`, `print(tensor)`, `.cpu()`,
-- `.tolist()`, `torch.cuda.synchronize()` become) and the GPU idle they leave behind. The ranks
-- in map_ranks are the map's (map_host_syncs, map_sync_idle, map_sync_stats: store/map_tables.py;
-- times on the rank's own clock, shifted by map_ranks.off): a rank's syncs need its own calls only.
-- Reads: cuda_api, memcpy, gpu_ops, steps, first_step, win, params, map_ranks, map_todo, map_host_syncs,
-- map_sync_idle, map_sync_stats, is_sync_api, in_selected, overlapping, gap_attr.
-- Provides:
--   host_syncs(rank INTEGER, tid BIGINT, start BIGINT, end BIGINT, name VARCHAR, step BIGINT)  sync calls
--       inside the rank's window: every is_sync_api call, and cudaMemcpy*/cudaMemcpyAsync calls whose copy
--       (same correlation_id) is DtoH into pageable memory (those block until the copy is done); name without
--       the `_vNNNN` suffix; step = the step whose range holds the call's start (any thread). Not a host
--       sync: the stream sync PyTorch makes right after a host-to-device copy from pageable memory (the
--       thread's previous CUDA call is that copy): the copy's own wait, which pageable_memcpy reports with
--       the copy
--   sync_idle(rank INTEGER, start BIGINT, end BIGINT, tid BIGINT, idle_ns BIGINT)  per sync: GPU idle from its
--       return (end) until the next GPU op on the rank starts, the cost that matters (after a sync the CPU
--       must refill the queue). 0 when GPU work is running at the return; cut at the next sync's return (so
--       idle after back-to-back syncs is counted once) and at the window's end.
--   sync_stats(rank INTEGER, n_syncs BIGINT, n_steps BIGINT, sync_per_step DOUBLE, blocked_ns BIGINT,
--       idle_after_ns BIGINT, idle_after_ns_per_step DOUBLE, top_name VARCHAR, names VARCHAR)  per rank with
--       a window, 0 syncs included (names: `api xN, ...`, most frequent first); n_steps = the selected steps
--       (NULL without steps, and then the per-step columns are NULL too)
--   sync_idle_ranges(rank, range_group, ns)  that idle by the CPU range it was spent in
--   sync_steps(rank, step, n)  the rank's selected iterations that hold a sync, and their syncs (each sync in
--       the last step that started before it: a `.item()` between two step ranges is its step's): syncs every
--       step, or a few steps' many (torch.save copying each tensor of a checkpoint to the host)
CREATE OR REPLACE TABLE host_syncs AS
WITH cp AS MATERIALIZED (  -- todo rows (map_todo in 21_stats_scope.sql): the pageable copies
    SELECT rank, correlation_id, kind FROM memcpy SEMI JOIN map_todo USING (rank)
    WHERE (kind = 'DtoH' AND dst_kind = 'pageable') OR (kind = 'HtoD' AND src_kind = 'pageable')
), calls AS (
    -- (the other ranks' calls in a subquery: a filter beside the SEMI JOIN is pushed into the
    -- scan, which then reads every rank's calls even where map_todo is empty)
    SELECT a.rank, a.tid, a.start, a."end", a.name FROM (SELECT * FROM cuda_api SEMI JOIN map_todo USING (rank)) a
    WHERE is_sync_api(a.name)
       OR (starts_with(a.name, 'cudaMemcpy') AND EXISTS (
               SELECT 1 FROM cp m WHERE m.rank = a.rank AND m.correlation_id = a.correlation_id AND m.kind = 'DtoH'))
), in_win AS (
    SELECT c.* FROM calls c JOIN win w USING (rank) WHERE c.start >= w.w0 AND c.start < w.w1
), prev AS (  -- each sync's previous CUDA call on its thread
    SELECT c.*, p.correlation_id AS prev_corr FROM in_win c
    ASOF LEFT JOIN (SELECT rank, tid, start, correlation_id FROM cuda_api SEMI JOIN map_todo USING (rank)) p
        ON p.rank = c.rank AND p.tid = c.tid AND p.start < c.start
), own AS (
    SELECT * FROM prev c WHERE NOT EXISTS (
        SELECT 1 FROM cp m WHERE m.rank = c.rank AND m.correlation_id = c.prev_corr AND m.kind = 'HtoD')
), stepped AS (
    SELECT h.rank, h.tid, h.start, h."end", h.name, max(s.step) AS step
    FROM own h LEFT JOIN steps s ON s.rank = h.rank AND h.start >= s.start AND h.start < s."end"
    GROUP BY h.rank, h.tid, h.start, h."end", h.name
)
SELECT rank, tid, start, "end", regexp_replace(name, '_v\d+$', '') AS name, step FROM stepped
UNION ALL BY NAME
SELECT m.* REPLACE (m.start + k.off AS start, m."end" + k.off AS "end") FROM map_host_syncs m JOIN map_ranks k USING (rank);

CREATE OR REPLACE TABLE sync_idle AS
WITH ops AS (  -- the latest end of any GPU op started so far: is the GPU busy at time t?
    SELECT rank, start, max("end") OVER (PARTITION BY rank ORDER BY start, "end" ROWS UNBOUNDED PRECEDING) AS busy_until
    FROM gpu_ops SEMI JOIN map_todo USING (rank)
), s AS (
    SELECT h.*, lead(h."end") OVER (PARTITION BY h.rank ORDER BY h."end", h.start, h.tid) AS next_sync_end
    FROM host_syncs h SEMI JOIN map_todo USING (rank)
), nxt AS (
    SELECT s.*, g.start AS next_op FROM s
    ASOF LEFT JOIN (SELECT rank, start FROM gpu_ops SEMI JOIN map_todo USING (rank)) g ON g.rank = s.rank AND g.start >= s."end"
), busy AS (
    SELECT n.*, o.busy_until FROM nxt n ASOF LEFT JOIN ops o ON o.rank = n.rank AND o.start < n."end"
)
SELECT b.rank, b.start, b."end", b.tid,
       CASE WHEN coalesce(b.busy_until, 0) > b."end" THEN 0
            ELSE greatest(0, least(coalesce(b.next_op, w.w1), coalesce(b.next_sync_end, w.w1), w.w1) - b."end")
       END AS idle_ns
FROM busy b JOIN win w USING (rank)
UNION ALL BY NAME
SELECT m.* REPLACE (m.start + k.off AS start, m."end" + k.off AS "end") FROM map_sync_idle m JOIN map_ranks k USING (rank);

CREATE OR REPLACE TABLE sync_stats AS
WITH n_steps AS (
    SELECT s.rank, count(DISTINCT s.step) AS n_steps FROM steps s JOIN first_step f USING (rank), params p
    WHERE in_selected(s.step, f.first_step, p.step_lo, p.step_hi) GROUP BY s.rank
), agg AS (
    SELECT rank, count(*) AS n_syncs, sum("end" - start) AS blocked_ns FROM host_syncs GROUP BY rank
), idle AS (
    SELECT rank, sum(idle_ns) AS idle_after_ns FROM sync_idle GROUP BY rank
), top AS (
    SELECT rank, arg_max(name, k) AS top_name,
           string_agg(name || ' x' || n, ', ' ORDER BY n DESC, name) AS names FROM (
        SELECT rank, name, count(*) AS n, (count(*), sum("end" - start), name) AS k FROM host_syncs GROUP BY rank, name)
    GROUP BY rank
)
SELECT w.rank, coalesce(a.n_syncs, 0) AS n_syncs, n.n_steps, coalesce(a.n_syncs, 0) / n.n_steps AS sync_per_step,
       coalesce(a.blocked_ns, 0) AS blocked_ns, coalesce(i.idle_after_ns, 0) AS idle_after_ns,
       coalesce(i.idle_after_ns, 0) / n.n_steps AS idle_after_ns_per_step, t.top_name, t.names
FROM win w LEFT JOIN agg a USING (rank) LEFT JOIN n_steps n USING (rank) LEFT JOIN idle i USING (rank)
LEFT JOIN top t USING (rank)
WHERE w.rank IN (SELECT rank FROM map_todo)
UNION ALL BY NAME
SELECT * FROM map_sync_stats SEMI JOIN map_ranks USING (rank);

-- Where the CPU was while the GPU idled after a sync: the GPU gaps (gap_attr) inside each
-- sync's idle interval, by CPU range. Idle spent in an input-pipeline range is reported as
-- a data-loader stall, not again as a sync cost.
CREATE OR REPLACE VIEW sync_idle_ranges AS
WITH iv AS (SELECT rank, "end" AS start, "end" + idle_ns AS "end" FROM sync_idle WHERE idle_ns > 0)
SELECT o.rank, g.range_group, sum(least(o.d_e, o."end") - greatest(o.d_s, o.start)) AS ns
FROM overlapping('gap_attr', 'iv') o JOIN gap_attr g ON g.rank = o.rank AND g.s = o.d_s
GROUP BY ALL;

CREATE OR REPLACE VIEW sync_steps AS
SELECT h.rank, s.step, count(*) AS n
FROM host_syncs h ASOF JOIN steps s ON s.rank = h.rank AND s.start <= h.start
JOIN first_step f ON f.rank = h.rank, params p
WHERE in_selected(s.step, f.first_step, p.step_lo, p.step_hi)
GROUP BY h.rank, s.step;
