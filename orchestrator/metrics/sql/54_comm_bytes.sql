-- Bytes per NCCL kernel, from NCCL's own NVTX ranges (nccl_calls: their payload's message
-- size). NCCL's size is its own count: the buffer for all-reduce, broadcast and send/recv, ONE
-- rank's part for all-gather (send) and reduce-scatter (recv). Every call belongs to the first
-- NCCL kernel of the same kind launched on its thread at or after it (an ASOF join); the calls
-- of one group add up.
-- Reads: nccl_calls, nccl_launch, comm_ops. Provides:
--   comm_bytes(rank, start, kind, msg_bytes, send_bytes, recv_bytes, n_calls, source)  one row per sized kernel
--   comm_size_info(n_calls, n_sized_calls, n_comm_kernels, n_sized_kernels)
--       how many calls and kernels have a size

CREATE OR REPLACE TABLE comm_bytes AS
WITH m AS (
    SELECT c.*, l.k_start FROM nccl_calls c
    ASOF JOIN nccl_launch l ON c.rank = l.rank AND c.tid = l.tid AND c.kind = l.kind AND l.l_start >= c.start
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
       (SELECT count(*) FROM comm_ops WHERE kind = 'kernel' AND is_comm) AS n_comm_kernels,
       (SELECT count(*) FROM comm_bytes) AS n_sized_kernels;
