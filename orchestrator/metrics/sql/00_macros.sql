-- Shared idioms as documented macros (the Perfetto stdlib way): a module that needs one of
-- these calls the macro instead of restating it, so each idiom has one definition.
-- Reads: nothing.
-- Provides:
--   is_comm(name)              an NCCL kernel (collective or point-to-point), from its short name
--   is_p2p(name)               an NCCL send/recv kernel rather than a collective
--   is_sync_api(name)          a CUDA call that blocks the calling thread until the GPU catches up
--   is_optimizer_kernel(name)  a kernel the optimizer step or gradient clipping launches once per step
--   range_group(t)             an NVTX name grouped for comparison (`forward mb3` -> `forward`)
--   in_selected(step, first_step, lo, hi)  a step inside the analysed steps
--   union_intervals(tbl)       table macro: the union of (rank, cls, s, e) intervals, as islands
--   union_length(tbl)          table macro: the length of that union per (rank, cls)
--   overlapping(dis, ivs)      table macro: each interval of ivs with each of dis it overlaps
--   binom_tail(k, n, p)        P(X >= k) for X ~ Binomial(n, p)
--   thread_role(name, is_main)  main / autograd (pt_autograd_N) / nccl (pt_nccl_*, NCCL threads)
--       / cuda (driver threads cudaNNN, cuda-EvtHandlr) / data worker (pt_data_worker,
--       DataLoader processes: a python thread outside the rank's process) / other
--   is_thread_wait(name)       an OS call by which a thread waits for another thread of its process
--   loo_ref(tbl)               table macro over (rank, key, x): per rank and key, the median and MAD
--       of the OTHER ranks (leave-one-out, so that with 2 ranks the slow one is compared to the
--       other; past 16 ranks the median and MAD of all ranks, which one rank barely moves)

-- An NCCL kernel (collective or point-to-point), from the kernel's short name. Classified
-- here, at analysis time, so a new rule never needs a new collect.
CREATE OR REPLACE MACRO is_comm(name) AS coalesce(starts_with(name, 'nccl'), false);

-- NCCL send/recv (pipeline or other point-to-point traffic) rather than a collective.
CREATE OR REPLACE MACRO is_p2p(name) AS
    is_comm(name) AND coalesce(regexp_matches(name, 'SendRecv|_Send|_Recv'), false);

-- CUDA runtime/driver calls that block the calling CPU thread until the GPU catches up:
-- what `.item()`, `print(tensor)`, `.cpu()`, `.tolist()` and `torch.cuda.synchronize()`
-- become. cudaMemcpy (not Async) to the host blocks too; cudaMemcpyAsync to pageable memory
-- is synchronous as well, but it is judged by its copy kind in the sync view.
CREATE OR REPLACE MACRO is_sync_api(name) AS coalesce(regexp_matches(name,
    '^cu(da)?(StreamSynchronize|DeviceSynchronize|EventSynchronize|CtxSynchronize|Memcpy(DtoH|D2H)?|MemcpyDtoH)(_v\d+)?$'),
    false);

-- NVTX names grouped for comparison: drop `, ...` suffixes and a trailing microbatch or
-- other number (`forward mb3` -> `forward`, `backward, seq = 5` -> `backward`), and write a
-- number standing alone after a space as `#` (the seed tutorial's `Step 3 Start` and
-- `Epoch 1 Start` -> `Step # Start`, `Epoch # Start`: one group, not one per step).
-- Numbers inside a word or a dotted path (`conv2d`, `layers.3.attn`) are kept.
-- Kernels an optimizer step launches once per step (PyTorch's foreach/fused optimizers and
-- clip_grad_norm_'s norm): the iteration of a gradient-accumulation loop.
CREATE OR REPLACE MACRO is_optimizer_kernel(name) AS coalesce(regexp_matches(name,
    '(?i)multi_tensor_apply|lpnorm|fused_?adam|adamw?_|_adamw?|sgd|lamb|adagrad|rmsprop|optimizer'), false);

CREATE OR REPLACE MACRO range_group(t) AS
    trim(regexp_replace(regexp_replace(regexp_replace(t, ',.*$', ''), '\s*(mb|microbatch|#)?\s*\d+$', ''),
                        '(\s)\d+\b', '\1#', 'g'));

-- A step inside the analysed steps: A..B when given (params.step_lo/step_hi), else every
-- step after the rank's first (the first step carries warm-up and capture-start costs).
CREATE OR REPLACE MACRO in_selected(step, first_step, lo, hi) AS
    CASE WHEN lo IS NULL THEN step > first_step ELSE step BETWEEN lo AND hi END;

-- Union of intervals per (rank, cls) from a table with columns rank, cls, s, e
-- (gaps-and-islands: a new island starts where an interval begins after every earlier one
-- has ended; it ends where the next island starts, at the latest end before it). One sort of
-- the rows, then one of the island starts only: no DISTINCT and no GROUP BY over every row.
-- Deterministic with duplicate rows: an equal copy of an earlier row is never a start (it
-- begins before the earlier copy ends), so the starts have distinct (s, e). Rows with e < s
-- are not intervals and are left out.
CREATE OR REPLACE MACRO union_intervals(tbl) AS TABLE
WITH m AS (
    SELECT rank, cls, s, e,
           max(e) OVER (PARTITION BY rank, cls ORDER BY s, e
                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end,
           max(e) OVER (PARTITION BY rank, cls ORDER BY s, e
                        ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS last_end
    FROM query_table(tbl) WHERE e >= s
), starts AS (
    SELECT * FROM m WHERE prev_end IS NULL OR s > prev_end
)
SELECT rank, cls, s, coalesce(lead(prev_end) OVER (PARTITION BY rank, cls ORDER BY s, e), last_end) AS e
FROM starts;

-- Length of that union per (rank, cls), for the sums that need no islands: sorted by start,
-- an interval adds what reaches past every earlier one, max(0, e - max(s, earlier ends)) (the
-- earlier intervals all start at or before s, so past s they cover [s, their max end)). Rows
-- with e < s are left out here too. Where no interval of a (rank, cls) begins before the one
-- just before it ends (a thread's own calls, one stream's ops), none begins before any earlier
-- one ends (the one right after that earlier one would), so the union is the sum of the
-- lengths: one sort and a lag, where the running maximum over the earlier ends costs about
-- three times as much (the thread table's launches: docs/benchmarks-code.md). The other
-- (rank, cls) take that maximum.
CREATE OR REPLACE MACRO union_length(tbl) AS TABLE
WITH m AS MATERIALIZED (
    SELECT rank, cls, s, e, lag(e) OVER (PARTITION BY rank, cls ORDER BY s, e) AS pe
    FROM query_table(tbl) WHERE e >= s
), g AS MATERIALIZED (
    SELECT rank, cls, sum(e - s) AS ns, coalesce(bool_or(s < pe), false) AS nested FROM m GROUP BY rank, cls
)
SELECT rank, cls, ns FROM g WHERE NOT nested
UNION ALL
SELECT rank, cls, sum(greatest(e - greatest(s, coalesce(prev_end, s)), 0)) AS ns FROM (
    SELECT rank, cls, s, e,
           max(e) OVER (PARTITION BY rank, cls ORDER BY s, e ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
    FROM m SEMI JOIN (SELECT rank, cls FROM g WHERE nested) USING (rank, cls))
GROUP BY rank, cls;

-- Every pair of an interval of `ivs` (rank, start, "end", ...) and an interval of `dis` (rank, s, e)
-- that overlap (d.s < i."end" AND d.e > i.start), where the intervals of `dis` never overlap
-- each other on a rank: GPU idle gaps, the islands of one class, the intervals between steps.
-- The ones an interval meets are then consecutive: two ASOF joins find the first and the last,
-- range() lists them. Linear in the rows plus the pairs, where a join on rank with the overlap
-- test as a residual compares every interval with every one of `dis` on its rank (quadratic in
-- the capture's length). Returns the columns of `ivs` plus d_s, d_e. Zero-length intervals of
-- `dis` are left out (every use sums overlaps or needs a positive length).
CREATE OR REPLACE MACRO overlapping(dis, ivs) AS TABLE
WITH i AS MATERIALIZED (
    SELECT row_number() OVER () AS i_id, * FROM query_table(ivs)
), d AS MATERIALIZED (  -- the ranks with intervals only (and -1: map_todo in 21_stats_scope.sql says why)
    SELECT rank, s, e, row_number() OVER (PARTITION BY rank ORDER BY s) AS k FROM query_table(dis)
    WHERE e > s AND rank IN (SELECT rank FROM i UNION ALL SELECT -1)
), lo AS (
    SELECT i.i_id, i.rank, d.k FROM i ASOF JOIN d ON d.rank = i.rank AND i.start < d.e
), hi AS (
    SELECT i.i_id, d.k FROM i ASOF JOIN d ON d.rank = i.rank AND i."end" > d.s
), ks AS (
    SELECT lo.i_id, lo.rank, unnest(range(lo.k, hi.k + 1)) AS k FROM lo JOIN hi USING (i_id) WHERE lo.k <= hi.k
), p AS (  -- joined on (rank, k) before the intervals come back: never a join on rank alone
    SELECT ks.i_id, d.s AS d_s, d.e AS d_e FROM ks JOIN d ON d.rank = ks.rank AND d.k = ks.k
)
SELECT i.* EXCLUDE (i_id), p.d_s, p.d_e FROM p JOIN i USING (i_id);

-- P(X >= k) for X ~ Binomial(n, p): how likely a rank starts last this often by chance.
CREATE OR REPLACE MACRO binom_tail(k, n, p) AS CASE WHEN k <= 0 THEN 1.0 ELSE least(1.0, (
    SELECT sum(exp(lgamma(n + 1) - lgamma(i + 1) - lgamma(n - i + 1) + i * ln(p) + (n - i) * ln(1 - p)))
    FROM range(CAST(k AS BIGINT), CAST(n AS BIGINT) + 1) r(i))) END;

-- What a rank's value is compared with: the other ranks' median and MAD of the same key (the
-- stats tables' outliers, a rank's capture overhead against the others').
CREATE OR REPLACE MACRO loo_ref(tbl) AS TABLE
WITH t AS (SELECT rank, key, x FROM query_table(tbl)),
n AS (SELECT key, count(*) AS n FROM t GROUP BY key),
-- Up to 16 ranks per key: leave-one-out (ranks x ranks pairs, cheap at that size).
small AS (SELECT t.* FROM t JOIN n USING (key) WHERE n.n <= 16),
pairs AS (SELECT a.rank, a.key, b.x FROM small a JOIN small b ON a.key = b.key AND a.rank <> b.rank),
med AS (SELECT rank, key, median(x) AS ref_med FROM pairs GROUP BY rank, key),
loo AS (
    SELECT p.rank, p.key, any_value(m.ref_med) AS ref_med, median(abs(p.x - m.ref_med)) AS ref_mad
    FROM pairs p JOIN med m USING (rank, key) GROUP BY p.rank, p.key
),
-- More ranks: one rank barely moves the median, and pairs would grow with ranks squared
-- (2,048 ranks x 50 kernels = 200 M rows): the median and MAD of all ranks instead.
big AS (SELECT t.* FROM t JOIN n USING (key) WHERE n.n > 16),
gmed AS (SELECT key, median(x) AS ref_med FROM big GROUP BY key),
gmad AS (SELECT b.key, median(abs(b.x - g.ref_med)) AS ref_mad FROM big b JOIN gmed g USING (key) GROUP BY b.key)
SELECT * FROM loo
UNION ALL
SELECT b.rank, b.key, g.ref_med, d.ref_mad FROM big b JOIN gmed g USING (key) JOIN gmad d USING (key);

-- Which thread of a rank's process a thread is, by its name (is_main: the process's own thread).
CREATE OR REPLACE MACRO thread_role(name, is_main) AS CASE
    WHEN is_main THEN 'main'
    WHEN name LIKE 'pt_autograd%' THEN 'autograd'
    WHEN coalesce(regexp_matches(name, '(?i)nccl'), false) THEN 'nccl'
    WHEN coalesce(regexp_matches(name, '(?i)^cuda'), false) THEN 'cuda'
    WHEN coalesce(regexp_matches(name, '(?i)data_worker|dataloader|loader'), false) THEN 'data worker'
    ELSE 'other' END;

-- A thread waiting for another thread of its own process (the autograd engine's device thread
-- running backward, the pin-memory thread, a queue): the wait says that it waited, not why.
CREATE OR REPLACE MACRO is_thread_wait(name) AS coalesce(regexp_matches(name,
    '^(pthread_(cond_(timed|clock)?wait|mutex_(timed)?lock|join|rwlock_(timed)?(rd|wr)lock|barrier_wait)|sem_(timed|clock)?wait|futex)$'),
    false);
