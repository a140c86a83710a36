-- The `nsys analyze` rules orch did not have, across ranks (pageable async memcpy and sync
-- APIs are rules/pageable_memcpy.py and rules/host_sync.py over 55_host_sync.sql): each rank's.
-- Map: per rank
-- Reads: cuda_api, memcpy, memset, gpu_ops, stats_cpu, stats_gpu, is_sync_api, union_intervals.
-- Provides:
--   sync_copies(rank INTEGER, what VARCHAR, n BIGINT, api_ns BIGINT, gpu_ns BIGINT, bytes BIGINT, n_steps
--       BIGINT, top_api VARCHAR)  per rank, what = `memcpy`: cudaMemcpy* calls without Async whose copy is
--       not a small (<= 64000 B) HtoD and not device-to-device (nsys cuda-sync-memcpy); `memset`: cudaMemset*
--       calls without Async with a memset (nsys cuda-sync-memset also requires pinned/managed memory, which
--       the store does not keep); api_ns = time the CPU spent in the calls (the cost), gpu_ns = on the GPU
--   sync_api_calls(rank INTEGER, name VARCHAR, n BIGINT, ns BIGINT, max_ns BIGINT, n_steps BIGINT)
--       cudaDeviceSynchronize/StreamSynchronize and the other is_sync_api calls (nsys cuda-sync-api: the
--       first two only)
--   gpu_slices(rank INTEGER, slice BIGINT, s BIGINT, e BIGINT, busy_ns BIGINT, util_pct DOUBLE)  nsys
--       gpu-low-util per rank: the rank's GPU span inside stats_gpu ([first op start, last op end]) cut in 30
--       equal slices; busy = union of every GPU op on the rank clipped to the slice (nsys adds concurrent ops
--       up, so its in-use can pass 100 % and hide idle time)
--   _slice_ops(rank, cls, s, e, start, end)  GPU ops clipped to each slice
CREATE OR REPLACE TABLE sync_copies AS
WITH a AS MATERIALIZED (
    SELECT rank, correlation_id, name, start, "end" FROM cuda_api
    WHERE (name LIKE 'cudaMemcpy%' AND name NOT LIKE '%Async%')
       OR (name LIKE 'cudaMemset%' AND lower(name) NOT LIKE '%async%')
), mc AS MATERIALIZED (
    SELECT rank, correlation_id, start, "end", bytes FROM memcpy
    WHERE NOT (bytes <= 64000 AND kind = 'HtoD') AND kind <> 'DtoD'
),
ms AS MATERIALIZED (SELECT rank, correlation_id, start, "end", bytes FROM memset),
c AS (
    SELECT a.rank, 'memcpy' AS what, a.correlation_id, a.name, a."end" - a.start AS api_ns,
           m."end" - m.start AS gpu_ns, m.bytes
    FROM a JOIN stats_cpu s USING (rank) JOIN mc m ON m.rank = a.rank AND m.correlation_id = a.correlation_id
    WHERE a.start >= s.s AND a.start < s.e AND a.name LIKE 'cudaMemcpy%' AND a.name NOT LIKE '%Async%'
    UNION ALL
    SELECT a.rank, 'memset', a.correlation_id, a.name, a."end" - a.start, m."end" - m.start, m.bytes
    FROM a JOIN stats_cpu s USING (rank) JOIN ms m ON m.rank = a.rank AND m.correlation_id = a.correlation_id
    WHERE a.start >= s.s AND a.start < s.e AND a.name LIKE 'cudaMemset%' AND lower(a.name) NOT LIKE '%async%'
)
SELECT c.rank, c.what, count(*) AS n, sum(c.api_ns) AS api_ns, sum(c.gpu_ns) AS gpu_ns, sum(c.bytes) AS bytes,
       any_value(s.n_steps) AS n_steps, mode(regexp_replace(c.name, '_v\d+$', '')) AS top_api
FROM c JOIN stats_cpu s USING (rank) GROUP BY c.rank, c.what;

CREATE OR REPLACE TABLE sync_api_calls AS
SELECT a.rank, regexp_replace(a.name, '_v\d+$', '') AS name, count(*) AS n, sum(a."end" - a.start) AS ns,
       max(a."end" - a.start) AS max_ns, any_value(s.n_steps) AS n_steps
FROM cuda_api a JOIN stats_cpu s USING (rank)
WHERE a.start >= s.s AND a.start < s.e AND is_sync_api(a.name) AND NOT starts_with(a.name, 'cudaMemcpy')
  AND NOT starts_with(a.name, 'cuMemcpy')
GROUP BY ALL;

CREATE OR REPLACE TABLE _slice_ops AS
SELECT o.rank, 0 AS cls, o.start AS s, o."end" AS e, o.start, o."end" FROM gpu_ops o JOIN stats_gpu g USING (rank)
WHERE o."end" > g.s AND o.start < g.e;

CREATE OR REPLACE TABLE gpu_slices AS
WITH ops AS (SELECT * FROM _slice_ops), span AS (
    SELECT o.rank, greatest(min(o.start), any_value(g.s)) AS s0, least(max(o."end"), any_value(g.e)) AS s1
    FROM ops o JOIN stats_gpu g USING (rank) GROUP BY o.rank
), busy AS (
    SELECT rank, s, e FROM union_intervals('_slice_ops')
), sl AS (
    SELECT rank, i AS slice, s0 + (i * (s1 - s0)) // 30 AS s, s0 + ((i + 1) * (s1 - s0)) // 30 AS e
    FROM span, range(30) r(i) WHERE s1 > s0
)
SELECT rank, slice, s, e, busy_ns, 100.0 * busy_ns / (e - s) AS util_pct FROM (
    -- least() and greatest() skip NULLs: a slice no op overlaps must add nothing, not its length
    SELECT sl.rank, sl.slice, sl.s, sl.e,
           coalesce(sum(least(b.e, sl.e) - greatest(b.s, sl.s)) FILTER (WHERE b.rank IS NOT NULL), 0) AS busy_ns
    FROM sl LEFT JOIN busy b ON b.rank = sl.rank AND b.e > sl.s AND b.s < sl.e
    GROUP BY sl.rank, sl.slice, sl.s, sl.e);
