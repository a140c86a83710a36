-- Bytes per NCCL kernel, from NCCL's own NVTX ranges (domain `NCCL`: ncclAllReduce, ncclSend,
-- ...). NCCL >= 2.19 attaches an extended payload {"Message size [bytes]": N, ...}; nsys
-- exports it as JSON only with `nsys export --include-json=true` (nsys >= 2024; orch collect
-- passes it when its nsys has it). NCCL's size is its own count: the buffer for all-reduce,
-- broadcast and send/recv, ONE rank's part for all-gather (send) and reduce-scatter (recv).
-- A call launches its kernel on the calling thread, at the call or at the ncclGroupEnd that
-- closes its group, so every call belongs to the first NCCL kernel of the same kind launched
-- on that thread at or after it (an ASOF join); the calls of one group add up.
-- Reads: nvtx, gpu_ops. Provides:
--   nccl_kind(name)   all_reduce | all_gather | reduce_scatter | broadcast | reduce | all_to_all | send_recv | other
--   nccl_calls(rank, tid, start, kind, call, msg_bytes, peer)
--       NCCL calls with their message size, from NCCL's NVTX payload
--   comm_bytes(rank, start, kind, msg_bytes, send_bytes, recv_bytes, n_calls, source)  one row per sized kernel
--   comm_size_info(n_calls, n_sized_calls, n_comm_kernels, n_sized_kernels)
--       how many calls and kernels have a size
--   _nccl_launch(rank, k_start, kind, tid, l_start)  each NCCL kernel's launching call
CREATE OR REPLACE MACRO nccl_kind(name) AS CASE
    WHEN name IS NULL THEN 'other'
    WHEN regexp_matches(name, 'AllReduce') THEN 'all_reduce'
    WHEN regexp_matches(name, 'AllGather') THEN 'all_gather'
    WHEN regexp_matches(name, 'ReduceScatter') THEN 'reduce_scatter'
    WHEN regexp_matches(name, 'Broadcast') THEN 'broadcast'
    WHEN regexp_matches(name, 'AllToAll') THEN 'all_to_all'
    WHEN regexp_matches(name, 'SendRecv|Send|Recv') THEN 'send_recv'
    WHEN regexp_matches(name, 'Reduce') THEN 'reduce'
    ELSE 'other' END;

-- Older stores have no payload column: UNION BY NAME fills it with NULL.
CREATE OR REPLACE TABLE nccl_calls AS
WITH n AS (
    SELECT * FROM (SELECT CAST(NULL AS VARCHAR) AS payload WHERE false)
    UNION ALL BY NAME
    SELECT * FROM nvtx WHERE domain = 'NCCL'
), j AS (
    SELECT rank, tid, start, text AS call, nccl_kind(text) AS kind,
           CASE WHEN json_valid(payload) THEN payload END AS js
    FROM n WHERE text LIKE 'nccl%' AND text NOT IN ('ncclGroupStart', 'ncclGroupEnd')
      AND nccl_kind(text) <> 'other'
)
SELECT rank, tid, start, kind, call,
       TRY_CAST(json_extract_string(js, '$."Message size [bytes]"') AS BIGINT) AS msg_bytes,
       TRY_CAST(json_extract_string(js, '$."Peer rank"') AS INTEGER) AS peer
FROM j;

CREATE OR REPLACE TABLE _nccl_launch AS
SELECT rank, start AS k_start, nccl_kind(name) AS kind, tid, launch AS l_start
FROM gpu_ops WHERE kind = 'kernel' AND is_comm AND launch IS NOT NULL;

CREATE OR REPLACE TABLE comm_bytes AS
WITH m AS (
    SELECT c.*, l.k_start FROM nccl_calls c
    ASOF JOIN _nccl_launch l ON c.rank = l.rank AND c.tid = l.tid AND c.kind = l.kind AND l.l_start >= c.start
)
SELECT rank, k_start AS start, any_value(kind) AS kind,
       sum(msg_bytes) AS msg_bytes,
       sum(CASE WHEN call = 'ncclSend' THEN msg_bytes ELSE 0 END) AS send_bytes,
       sum(CASE WHEN call = 'ncclRecv' THEN msg_bytes ELSE 0 END) AS recv_bytes,
       count(*) AS n_calls, 'nccl_nvtx_payload' AS source
FROM m GROUP BY rank, k_start
HAVING count(msg_bytes) = count(*);

CREATE OR REPLACE TABLE comm_size_info AS
SELECT (SELECT count(*) FROM nccl_calls) AS n_calls,
       (SELECT count(msg_bytes) FROM nccl_calls) AS n_sized_calls,
       (SELECT count(*) FROM gpu_ops WHERE kind = 'kernel' AND is_comm) AS n_comm_kernels,
       (SELECT count(*) FROM comm_bytes) AS n_sized_kernels;
