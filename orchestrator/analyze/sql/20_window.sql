-- The steady-state window per rank: where every per-rank metric is measured.
-- Reads: gpu_ops, steps, first_step, params, in_selected.
-- Provides:
--   win(rank, w0, w1, source)  [first start, last end] of the GPU ops launched inside the
--                  selected steps (see in_selected); ranks without steps (or whose steps
--                  launched no GPU work) use the whole capture; CPU-only captures use the
--                  selected steps' NVTX span.
CREATE OR REPLACE TABLE win AS
WITH sel AS (
    SELECT o.rank, min(o.start) AS w0, max(o."end") AS w1
    FROM gpu_ops o JOIN first_step f USING (rank), params p
    WHERE o.step IS NOT NULL AND in_selected(o.step, f.first_step, p.step_lo, p.step_hi)
    GROUP BY o.rank
)
SELECT rank, w0, w1, 'steps' AS source FROM sel
UNION ALL
SELECT rank, min(start), max("end"), 'capture' FROM gpu_ops
WHERE rank NOT IN (SELECT rank FROM sel) GROUP BY rank
UNION ALL
SELECT s.rank, min(s.start), max(s."end"), 'steps (cpu only)' FROM steps s JOIN first_step f USING (rank), params p
WHERE s.rank NOT IN (SELECT rank FROM gpu_ops) AND in_selected(s.step, f.first_step, p.step_lo, p.step_hi)
GROUP BY s.rank;
