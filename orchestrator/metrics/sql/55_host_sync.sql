-- Host syncs: CPU calls that wait for the GPU (what `.item()`, `print(tensor)`, `.cpu()`,
-- `.tolist()`, `torch.cuda.synchronize()` become) and the GPU idle they leave behind: a rank's
-- syncs need its own calls only.
-- Map: per rank
-- Reads: cuda_api, memcpy, gpu_ops, steps, first_step, win, params, is_sync_api, in_selected.
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
--       idle_after_ns BIGINT, idle_after_ns_per_step DOUBLE, top_name VARCHAR, names VARCHAR)  per rank
--       with a window, 0 syncs included (names: `api xN, ...`, most frequent first); n_steps = the selected
--       steps (NULL without steps, and then the per-step columns are NULL too)
CREATE OR REPLACE TABLE host_syncs AS
WITH cp AS MATERIALIZED (  -- the pageable copies
    SELECT rank, correlation_id, kind FROM memcpy
    WHERE (kind = 'DtoH' AND dst_kind = 'pageable') OR (kind = 'HtoD' AND src_kind = 'pageable')
), calls AS (
    SELECT a.rank, a.tid, a.start, a."end", a.name FROM cuda_api a
    WHERE is_sync_api(a.name)
       OR (starts_with(a.name, 'cudaMemcpy') AND EXISTS (
               SELECT 1 FROM cp m WHERE m.rank = a.rank AND m.correlation_id = a.correlation_id AND m.kind = 'DtoH'))
), in_win AS (
    SELECT c.* FROM calls c JOIN win w USING (rank) WHERE c.start >= w.w0 AND c.start < w.w1
), prev AS (  -- each sync's previous CUDA call on its thread
    SELECT c.*, p.correlation_id AS prev_corr FROM in_win c
    ASOF LEFT JOIN (SELECT rank, tid, start, correlation_id FROM cuda_api) p
        ON p.rank = c.rank AND p.tid = c.tid AND p.start < c.start
), own AS (
    SELECT * FROM prev c WHERE NOT EXISTS (
        SELECT 1 FROM cp m WHERE m.rank = c.rank AND m.correlation_id = c.prev_corr AND m.kind = 'HtoD')
), stepped AS (
    SELECT h.rank, h.tid, h.start, h."end", h.name, max(s.step) AS step
    FROM own h LEFT JOIN steps s ON s.rank = h.rank AND h.start >= s.start AND h.start < s."end"
    GROUP BY h.rank, h.tid, h.start, h."end", h.name
)
SELECT rank, tid, start, "end", regexp_replace(name, '_v\d+$', '') AS name, step FROM stepped;

CREATE OR REPLACE TABLE sync_idle AS
WITH ops AS (  -- the latest end of any GPU op started so far: is the GPU busy at time t?
    SELECT rank, start, max("end") OVER (PARTITION BY rank ORDER BY start, "end" ROWS UNBOUNDED PRECEDING) AS busy_until
    FROM gpu_ops
), s AS (
    SELECT h.*, lead(h."end") OVER (PARTITION BY h.rank ORDER BY h."end", h.start, h.tid) AS next_sync_end
    FROM host_syncs h
), nxt AS (
    SELECT s.*, g.start AS next_op FROM s
    ASOF LEFT JOIN (SELECT rank, start FROM gpu_ops) g ON g.rank = s.rank AND g.start >= s."end"
), busy AS (
    SELECT n.*, o.busy_until FROM nxt n ASOF LEFT JOIN ops o ON o.rank = n.rank AND o.start < n."end"
)
SELECT b.rank, b.start, b."end", b.tid,
       CASE WHEN coalesce(b.busy_until, 0) > b."end" THEN 0
            ELSE greatest(0, least(coalesce(b.next_op, w.w1), coalesce(b.next_sync_end, w.w1), w.w1) - b."end")
       END AS idle_ns
FROM busy b JOIN win w USING (rank);

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
LEFT JOIN top t USING (rank);
