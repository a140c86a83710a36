-- Per rank and step: the step's span on the GPU (first start to last end of the work its
-- CPU range launched), for every step (the first one included, marked).
CREATE OR REPLACE TEMP TABLE step_gpu AS
SELECT o.rank, o.step, min(o.start) AS s, max(o."end") AS e, (max(o."end") - min(o.start)) AS ns
FROM gpu_ops o WHERE o.step IS NOT NULL GROUP BY o.rank, o.step;
