-- Shared idioms as documented macros (the Perfetto stdlib way): a module that needs one of
-- these calls the macro instead of restating it, so each idiom has one definition.
-- Reads: nothing. Provides: is_comm, is_p2p, is_sync_api, range_group, in_selected,
-- union_intervals, binom_tail.

-- An NCCL kernel (collective or point-to-point), from the kernel's short name. Classified
-- here, at analysis time, so a new rule never needs a new collect.
CREATE OR REPLACE TEMP MACRO is_comm(name) AS coalesce(starts_with(name, 'nccl'), false);

-- NCCL send/recv (pipeline or other point-to-point traffic) rather than a collective.
CREATE OR REPLACE TEMP MACRO is_p2p(name) AS
    is_comm(name) AND coalesce(regexp_matches(name, 'SendRecv|_Send|_Recv'), false);

-- CUDA runtime/driver calls that block the calling CPU thread until the GPU catches up:
-- what `.item()`, `print(tensor)`, `.cpu()`, `.tolist()` and `torch.cuda.synchronize()`
-- become. cudaMemcpy (not Async) to the host blocks too; cudaMemcpyAsync to pageable memory
-- is synchronous as well, but it is judged by its copy kind in the sync view.
CREATE OR REPLACE TEMP MACRO is_sync_api(name) AS coalesce(regexp_matches(name,
    '^cu(da)?(StreamSynchronize|DeviceSynchronize|EventSynchronize|CtxSynchronize|Memcpy(DtoH|D2H)?|MemcpyDtoH)(_v\d+)?$'),
    false);

-- NVTX names grouped for comparison: drop `, ...` suffixes and a trailing microbatch or
-- other number (`forward mb3` -> `forward`, `backward, seq = 5` -> `backward`).
CREATE OR REPLACE TEMP MACRO range_group(t) AS
    trim(regexp_replace(regexp_replace(t, ',.*$', ''), '\s*(mb|microbatch|#)?\s*\d+$', ''));

-- A step inside the analysed steps: A..B when given (params.step_lo/step_hi), else every
-- step after the rank's first (the first step carries warm-up and capture-start costs).
CREATE OR REPLACE TEMP MACRO in_selected(step, first_step, lo, hi) AS
    CASE WHEN lo IS NULL THEN step > first_step ELSE step BETWEEN lo AND hi END;

-- Union of intervals per (rank, cls) from a table with columns rank, cls, s, e
-- (gaps-and-islands: a new island starts where an interval begins after every earlier one
-- has ended). Duplicates go first: the two windows sort separately, and two equal rows in a
-- different order in each would put one of them in the previous island (a wrong, and
-- run-to-run different, union).
CREATE OR REPLACE TEMP MACRO union_intervals(tbl) AS TABLE
WITH m AS (
    SELECT rank, cls, s, e,
           max(e) OVER (PARTITION BY rank, cls ORDER BY s, e
                        ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev_end
    FROM (SELECT DISTINCT rank, cls, s, e FROM query_table(tbl))
), g AS (
    SELECT *, sum(CASE WHEN prev_end IS NULL OR s > prev_end THEN 1 ELSE 0 END)
              OVER (PARTITION BY rank, cls ORDER BY s, e ROWS UNBOUNDED PRECEDING) AS grp
    FROM m
)
SELECT rank, cls, min(s) AS s, max(e) AS e FROM g GROUP BY rank, cls, grp;

-- P(X >= k) for X ~ Binomial(n, p): how likely a rank starts last this often by chance.
CREATE OR REPLACE TEMP MACRO binom_tail(k, n, p) AS CASE WHEN k <= 0 THEN 1.0 ELSE least(1.0, (
    SELECT sum(exp(lgamma(n + 1) - lgamma(i + 1) - lgamma(n - i + 1) + i * ln(p) + (n - i) * ln(1 - p)))
    FROM range(CAST(k AS BIGINT), CAST(n AS BIGINT) + 1) r(i))) END;
