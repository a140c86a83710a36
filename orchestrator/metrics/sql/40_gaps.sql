-- GPU idle gaps >= params.gap_ns inside the window, each attributed to what the CPU was
-- doing: the innermost default-domain NVTX range on the rank's threads that covers at least
-- half of the gap. Step ranges and the ranges that contain them (epochs) say nothing about
-- the cause and are skipped. A gap outside every step range, between two steps, is where
-- `for batch in loader` waits for the next batch: `between steps (input pipeline)` - unless
-- the loop thread synchronised with the GPU, copied results to the host or launched kernels
-- anywhere in that interval (metrics, logging, an evaluation run between steps: `.item()`,
-- `.cpu()`), then it is `between steps (other work)`. (Copying the next batch in is input.)
-- orch's loop marks count as the user's ranges (`orch: next batch`: the wait for the next batch,
-- whatever the loop's own NVTX; a range of the user's inside it, deeper, names it first).
-- A gap no range of the user's explains is named by what the loop thread was doing at its
-- midpoint: a library's own range it was in, in the library's NVTX domain (`loop thread in
-- NCCL:ncclCommInitRankConfig`: NCCL creating a communicator at its first collective; it says
-- what the thread did, where `between steps` says only where), the CUDA call (`loop thread in
-- cudaStreamSynchronize`), else the OS runtime call (`loop thread in poll`), else `loop thread in
-- Python between CUDA calls` (running its own code: no call to wait in). Where that OS call is a
-- wait for another thread of its process (is_thread_wait) and another thread launched the GPU work
-- that ends the gap, the gap is that thread's, and its name says which (`loop thread in
-- pthread_cond_wait for the autograd thread`: backward() waits while the autograd engine's thread
-- launches the backward's kernels, and the GPU waited for that thread's next launch).
-- A rank's gaps need its own events only. The device allocator's calls count per rank in its
-- selected iterations (alloc_calls).
-- Map: per rank
-- Reads: islands, nvtx, cpu_ranges, steps, first_step, loop_thread, cuda_api, loop_osrt, memcpy, params,
-- gpu_ops, threads, is_sync_api, overlapping, range_group, in_selected, thread_role, is_thread_wait.
-- Provides:
--   busy_gaps(rank, s, e, dur)   every gap between busy islands (any length) of the ranks mapped here
--   between_steps(rank INTEGER, s BIGINT, e BIGINT, other_work BOOLEAN)  the intervals between consecutive
--       step ranges
--   gap_attr(rank INTEGER, s BIGINT, e BIGINT, dur BIGINT, range_group VARCHAR, range_text VARCHAR)  gaps >=
--       gap_ns with their CPU range
--   small_gaps(rank INTEGER, n BIGINT, ns BIGINT)  per rank, the count and time of gaps shorter than gap_ns
--       (the launch-bound signature)
--   alloc_gaps(rank INTEGER, n BIGINT, ns BIGINT, small_n BIGINT, small_ns BIGINT)  per rank, the gaps (any
--       length) that device allocations and frees (alloc_api) fill at least a quarter of, and those of them
--       shorter than gap_ns: the GPU waited for the launch that came after the allocator's call and its host
--       work around it (a long wait for something else, the next batch, with one allocation inside is not
--       theirs)
--   alloc_api(rank, start, end, base)  the device allocations and frees (base: the call's
--       name without its _vN suffix): cudaMalloc*, cuMemAlloc*, cuMemCreate, cudaFree*, cuMemFree*,
--       cuMemRelease
--   alloc_calls(rank INTEGER, n_steps BIGINT, n_alloc BIGINT, n_free BIGINT, n_sync_free BIGINT, api_ns BIGINT,
--       step_ns BIGINT)  allocator CUDA calls in the selected iterations (each from its step's start to the
--       next step's start)
CREATE OR REPLACE TABLE busy_gaps AS
WITH b AS (
    SELECT rank, s, e, lead(s) OVER (PARTITION BY rank ORDER BY s) AS next_s
    FROM islands WHERE cls = 'busy'
)
SELECT rank, e AS s, next_s AS e, next_s - e AS dur FROM b WHERE next_s IS NOT NULL;

-- The intervals between two consecutive step ranges (NVTX steps only), and whether the loop
-- thread synchronised with the GPU, copied to the host or launched kernels in them.
CREATE OR REPLACE TABLE between_steps AS
WITH iv AS (
    SELECT rank, "end" AS s, lead(start) OVER (PARTITION BY rank ORDER BY start) AS e
    FROM steps WHERE family < 5
), calls AS (  -- only the calls that decide: syncs, copies to the host, launches
    SELECT a.rank, a.start, is_sync_api(a.name) OR m.kind = 'DtoH' AS sync_or_copy, a.name LIKE '%Launch%' AS launch
    FROM cuda_api a JOIN loop_thread l USING (rank, tid)
    LEFT JOIN memcpy m ON m.rank = a.rank AND m.correlation_id = a.correlation_id
    WHERE is_sync_api(a.name) OR a.name LIKE '%Launch%' OR a.name LIKE '%emcpy%'
), hits AS (  -- the intervals never overlap: the one a call starts in is the last starting at or before it
    SELECT c.rank, i.s, count(*) FILTER (WHERE c.sync_or_copy) > 0 OR count(*) FILTER (WHERE c.launch) >= 3 AS other_work
    FROM calls c ASOF JOIN (SELECT * FROM iv WHERE e > s) i ON i.rank = c.rank AND c.start >= i.s
    WHERE c.start < i.e GROUP BY ALL
)
SELECT iv.rank, iv.s, iv.e, coalesce(h.other_work, false) AS other_work
FROM iv LEFT JOIN hits h USING (rank, s)
WHERE iv.e > iv.s;

CREATE OR REPLACE TABLE gap_attr AS
WITH gaps AS (
    SELECT g.* FROM busy_gaps g, params p WHERE g.dur >= p.gap_ns
), long_ranges AS (  -- covering half of a gap takes at least half of the shortest gap
    SELECT c.*, n.text FROM cpu_ranges c JOIN nvtx n ON n.rowid = c.nvtx_row, params p
    WHERE 2 * (c."end" - c.start) >= p.gap_ns
), cand AS (  -- a range covering half a gap contains its midpoint; overlapping() finds the pairs
    SELECT c.rank, c.d_s AS s, c.text, c.depth,
           row_number() OVER (PARTITION BY c.rank, c.d_s ORDER BY c.depth DESC, c."end" - c.start, c.start, c.tid, c.text) AS pick
    FROM overlapping('gaps', 'long_ranges') c
    WHERE 2 * (least(c."end", c.d_e) - greatest(c.start, c.d_s)) >= c.d_e - c.d_s
), between AS (  -- the interval between steps holding the gap's midpoint (they never overlap)
    SELECT g.rank, g.s, b.other_work FROM gaps g
    ASOF JOIN between_steps b ON b.rank = g.rank AND g.s + g.dur // 2 >= b.s
    WHERE g.s + g.dur // 2 < b.e
), mid AS (SELECT rank, s, s + dur // 2 AS m FROM gaps),
api AS (  -- the loop thread's CUDA call holding the gap's midpoint (the last one started before it)
    SELECT g.rank, g.s, regexp_replace(a.name, '_v\d+$', '') AS call FROM mid g
    ASOF JOIN (SELECT a.rank, a.start, a."end", a.name FROM cuda_api a JOIN loop_thread USING (rank, tid)) a
        ON a.rank = g.rank AND g.m >= a.start
    WHERE a."end" > g.m
), os AS (
    SELECT g.rank, g.s, o.name AS call FROM mid g
    ASOF JOIN loop_osrt o
        ON o.rank = g.rank AND g.m >= o.start
    WHERE o."end" > g.m
), nxt AS (  -- the thread that launched the GPU work ending the gap, where it is not the loop thread
    SELECT g.rank, g.s, min(thread_role(t.name, t.os_tid = t.pid)) AS role
    FROM gaps g JOIN gpu_ops o ON o.rank = g.rank AND o.start = g.e
    JOIN loop_thread l ON l.rank = g.rank LEFT JOIN threads t ON t.rank = o.rank AND t.tid = o.tid
    WHERE o.tid <> l.tid GROUP BY g.rank, g.s
), lib AS (  -- the loop thread's library range (NCCL's, CCCL's) holding the gap's midpoint
    SELECT g.rank, g.s, l.domain || ':' || l.text AS call FROM mid g
    ASOF JOIN (SELECT n.rank, n.start, n."end", n.domain, n.text FROM nvtx n JOIN loop_thread USING (rank, tid)
               WHERE n.domain_id <> 0 AND n.domain NOT IN ('orch', 'orch.py') AND n.text IS NOT NULL) l
        ON l.rank = g.rank AND g.m >= l.start
    WHERE l."end" > g.m
)
SELECT g.rank, g.s, g.e, g.dur,
       coalesce(range_group(c.text),
                CASE WHEN l.call IS NOT NULL THEN 'loop thread in ' || l.call
                     WHEN b.other_work THEN 'between steps (other work)'
                     WHEN b.rank IS NOT NULL THEN 'between steps (input pipeline)'
                     WHEN a.call IS NOT NULL THEN 'loop thread in ' || a.call
                     WHEN o.call IS NOT NULL THEN 'loop thread in ' || o.call || CASE
                         WHEN NOT is_thread_wait(o.call) OR x.role IS NULL THEN ''
                         WHEN x.role = 'other' THEN ' for another thread' ELSE ' for the ' || x.role || ' thread' END
                     ELSE 'loop thread in Python between CUDA calls' END) AS range_group,
       c.text AS range_text
FROM gaps g LEFT JOIN cand c ON c.rank = g.rank AND c.s = g.s AND c.pick = 1
LEFT JOIN between b ON b.rank = g.rank AND b.s = g.s
LEFT JOIN api a ON a.rank = g.rank AND a.s = g.s
LEFT JOIN os o ON o.rank = g.rank AND o.s = g.s
LEFT JOIN lib l ON l.rank = g.rank AND l.s = g.s
LEFT JOIN nxt x ON x.rank = g.rank AND x.s = g.s;

-- Sub-threshold gaps: the launch-bound signature (many tiny kernels with gaps between them).
CREATE OR REPLACE TABLE small_gaps AS
SELECT g.rank, count(*) AS n, sum(g.dur) AS ns FROM busy_gaps g, params p
WHERE g.dur < p.gap_ns GROUP BY g.rank;

-- Allocator churn: device allocations and frees called inside the selected iterations.
-- cudaFree and cuMemFree wait for the whole device to finish before they return: each is a
-- device synchronisation in the loop. cuMemCreate/cuMemRelease are the expandable-segments
-- allocator's calls. Host (pinned) allocations are not counted.
CREATE OR REPLACE TABLE alloc_api AS
WITH names AS (  -- the regex once per distinct name
    SELECT name, regexp_replace(name, '_v\d+$', '') AS base
    FROM (SELECT DISTINCT name FROM cuda_api)
    WHERE regexp_matches(regexp_replace(name, '_v\d+$', ''),
        '^(cudaMalloc|cudaMallocAsync|cudaMallocFromPoolAsync|cudaMallocManaged|cudaMallocPitch|cudaMalloc3D|'
        'cuMemAlloc|cuMemAllocAsync|cuMemAllocFromPoolAsync|cuMemAllocManaged|cuMemAllocPitch|cuMemCreate|'
        'cudaFree|cudaFreeAsync|cuMemFree|cuMemFreeAsync|cuMemRelease)$')
)
SELECT a.rank, a.start, a."end", n.base FROM cuda_api a JOIN names n USING (name);

CREATE OR REPLACE TABLE alloc_calls AS
WITH it AS (  -- selected iterations: from a step's start to the next one's (the last: its range end)
    SELECT s.rank, s.start AS s, coalesce(lead(s.start) OVER (PARTITION BY s.rank ORDER BY s.start), s."end") AS e,
           s.step, f.first_step
    FROM steps s JOIN first_step f USING (rank)
), sel AS (
    SELECT it.* FROM it, params p WHERE in_selected(it.step, it.first_step, p.step_lo, p.step_hi)
), placed AS (  -- each call in the iteration it starts in (ASOF: no steps x calls join)
    SELECT c.* FROM alloc_api c ASOF JOIN sel ON sel.rank = c.rank AND c.start >= sel.s WHERE c.start < sel.e
), per AS (
    SELECT rank,
           count(*) FILTER (WHERE base LIKE '%Alloc%' OR base LIKE 'cudaMalloc%' OR base = 'cuMemCreate') AS n_alloc,
           count(*) FILTER (WHERE base LIKE '%Free%' OR base = 'cuMemRelease') AS n_free,
           count(*) FILTER (WHERE base IN ('cudaFree', 'cuMemFree')) AS n_sync_free,
           sum("end" - start) AS api_ns
    FROM placed GROUP BY rank
)
SELECT s.rank, s.n_steps, coalesce(per.n_alloc, 0) AS n_alloc, coalesce(per.n_free, 0) AS n_free,
       coalesce(per.n_sync_free, 0) AS n_sync_free, coalesce(per.api_ns, 0) AS api_ns, s.step_ns
FROM (SELECT rank, count(*) AS n_steps, sum(e - s) AS step_ns FROM sel GROUP BY rank) s LEFT JOIN per USING (rank);

CREATE OR REPLACE TABLE alloc_gaps AS
WITH o AS (
    SELECT g.rank, g.s, g.dur, sum(least(g.e, a."end") - greatest(g.s, a.start)) AS filled
    FROM busy_gaps g JOIN alloc_api a ON a.rank = g.rank AND a.start < g.e AND a."end" > g.s
    GROUP BY g.rank, g.s, g.dur
)
SELECT o.rank, count(*) AS n, sum(o.dur) AS ns, count(*) FILTER (WHERE o.dur < p.gap_ns) AS small_n,
       coalesce(sum(o.dur) FILTER (WHERE o.dur < p.gap_ns), 0) AS small_ns
FROM o, params p WHERE 4 * o.filled >= o.dur GROUP BY o.rank;
