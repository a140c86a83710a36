-- NCCL's own NVTX ranges (domain `NCCL`: ncclAllReduce, ncclSend, ...) and the kernels they
-- launch. NCCL >= 2.19 attaches an extended payload {"NCCL communicator ID": C, "Message size
-- [bytes]": N, ...}; nsys exports it as JSON only with `nsys export --include-json=true` (nsys
-- >= 2024; orch collect passes it when its nsys has it). A call launches its kernel on the
-- calling thread, at the call or at the ncclGroupEnd that closes its group. The communicator
-- ID is the same on every member of a communicator and differs between communicators: it tells
-- which ranks a collective ran among (a TP group, a stage's DP group) without a layout.
-- Reads: nvtx, comm_ops. Provides:
--   nccl_kind(name)   all_reduce | all_gather | reduce_scatter | broadcast | reduce | all_to_all | send_recv | other
--   nccl_calls(rank, tid, start, kind, call, msg_bytes, peer, comm)
--       NCCL calls with their message size, peer and communicator, from NCCL's NVTX payload
--   nccl_launch(rank, k_start, kind, tid, l_start)  each NCCL kernel's launching call
--   nccl_kernel_comm(rank, start, comm)   each NCCL kernel's communicator: that of the last call
--       of its kind on the launching thread at or before the launch (one group's calls share it)
--   nccl_comm_size(comm, n_ranks)   the communicator's size where NCCL's init payload says it
--   _nccl_nvtx(rank, tid, start, text, js)   NCCL's ranges, their payload where it is JSON

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
CREATE OR REPLACE TABLE _nccl_nvtx AS
WITH n AS (
    SELECT * FROM (SELECT CAST(NULL AS VARCHAR) AS payload WHERE false)
    UNION ALL BY NAME
    SELECT * FROM nvtx WHERE domain = 'NCCL'
)
SELECT rank, tid, start, text, CASE WHEN json_valid(payload) THEN payload END AS js FROM n;

CREATE OR REPLACE TABLE nccl_calls AS
SELECT rank, tid, start, nccl_kind(text) AS kind, text AS call,
       TRY_CAST(json_extract_string(js, '$."Message size [bytes]"') AS BIGINT) AS msg_bytes,
       TRY_CAST(json_extract_string(js, '$."Peer rank"') AS INTEGER) AS peer,
       json_extract_string(js, '$."NCCL communicator ID"') AS comm
FROM _nccl_nvtx
WHERE text LIKE 'nccl%' AND text NOT IN ('ncclGroupStart', 'ncclGroupEnd') AND nccl_kind(text) <> 'other';

CREATE OR REPLACE TABLE nccl_launch AS
SELECT rank, start AS k_start, nccl_kind(name) AS kind, tid, launch AS l_start
FROM comm_ops WHERE kind = 'kernel' AND is_comm AND launch IS NOT NULL;

CREATE OR REPLACE TABLE nccl_kernel_comm AS
SELECT l.rank, l.k_start AS start, c.comm
FROM nccl_launch l
ASOF JOIN (SELECT * FROM nccl_calls WHERE comm IS NOT NULL) c
    ON c.rank = l.rank AND c.tid = l.tid AND c.kind = l.kind AND l.l_start >= c.start;

CREATE OR REPLACE TABLE nccl_comm_size AS
SELECT comm, max(n) AS n_ranks
FROM (SELECT json_extract_string(js, '$."NCCL communicator ID"') AS comm,
             TRY_CAST(json_extract_string(js, '$."No. of ranks"') AS INTEGER) AS n
      FROM _nccl_nvtx WHERE js LIKE '%"No. of ranks"%')
WHERE comm IS NOT NULL AND n IS NOT NULL
GROUP BY comm;
