-- GPU work and the step that launched it.
-- Reads: kernels, memcpy, memset, cuda_api, steps. Provides:
--   gpu_ops(rank, kind, is_comm, start, end, correlation_id, name, step)
--   first_step(rank, first_step)
CREATE OR REPLACE TABLE gpu_raw AS
SELECT rank, 'kernel' AS kind, is_comm(short_name) AS is_comm, start, "end", correlation_id, short_name AS name
FROM kernels
UNION ALL
SELECT rank, 'memcpy', false, start, "end", correlation_id, 'memcpy ' || kind FROM memcpy
UNION ALL
SELECT rank, 'memset', false, start, "end", correlation_id, 'memset' FROM memset;

-- A GPU op belongs to the step during which its CUDA launch happened, on any thread of the
-- rank: backward kernels are launched by the autograd engine's thread (pt_autograd_N) while
-- the loop's thread waits inside its step range.
-- Only the calls that launched GPU work are placed (a quarter of all calls in a DDP capture).
CREATE OR REPLACE TABLE launch_step AS
WITH a AS (
    SELECT a.rank, a.correlation_id, a.start FROM cuda_api a
    SEMI JOIN gpu_raw g ON g.rank = a.rank AND g.correlation_id = a.correlation_id
)
SELECT a.rank, a.correlation_id, max(s.step) AS step
FROM a JOIN steps s ON s.rank = a.rank AND a.start >= s.start AND a.start < s."end"
GROUP BY a.rank, a.correlation_id;

CREATE OR REPLACE TABLE gpu_ops AS
SELECT g.*, l.step FROM gpu_raw g
LEFT JOIN launch_step l ON l.rank = g.rank AND l.correlation_id = g.correlation_id;

CREATE OR REPLACE TABLE first_step AS
SELECT rank, min(step) AS first_step FROM steps GROUP BY rank;
