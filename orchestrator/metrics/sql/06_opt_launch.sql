-- The optimizer's kernels (and gradient clipping's), timed by their launch call: what tells a
-- rank's step ranges from its micro-batches (10_steps.sql). Every rank's, whatever its ranges:
-- the map's are taken wherever it ran this SQL, so they must not depend on the job's step family.
-- Map: per rank (map_done)
-- Reads: kernels, cuda_api, is_optimizer_kernel. Provides:
--   opt_launch(rank INTEGER, start BIGINT)   the launches of the optimizer's kernels
CREATE OR REPLACE TABLE opt_launch AS
WITH k AS (
    SELECT rank, correlation_id FROM kernels
    WHERE short_name IN (SELECT short_name FROM (SELECT DISTINCT short_name FROM kernels)
                         WHERE is_optimizer_kernel(short_name))
)
SELECT a.rank, a.start FROM cuda_api a SEMI JOIN k ON k.rank = a.rank AND k.correlation_id = a.correlation_id;
