-- The steady-state window per rank: where every per-rank metric is measured.
-- Reads: step_ops, steps, first_step, params, in_selected.
-- Provides:
--   win(rank, w0, w1, source)  [first start, last end] of the GPU ops launched inside the
--                  selected steps (see in_selected); ranks without steps (or whose steps
--                  launched no GPU work) use the whole capture; CPU-only captures use the
--                  selected steps' NVTX span.
CREATE OR REPLACE TABLE win AS
WITH sel AS (
    SELECT o.rank, min(o.s) AS w0, max(o.e) AS w1
    FROM step_ops o JOIN first_step f USING (rank), params p
    WHERE o.step IS NOT NULL AND in_selected(o.step, f.first_step, p.step_lo, p.step_hi)
    GROUP BY o.rank
)
SELECT rank, w0, w1, 'steps' AS source FROM sel
UNION ALL
SELECT rank, min(s), max(e), 'capture' FROM step_ops
WHERE rank NOT IN (SELECT rank FROM sel) GROUP BY rank
UNION ALL
SELECT s.rank, min(s.start), max(s."end"), 'steps (cpu only)' FROM steps s JOIN first_step f USING (rank), params p
WHERE s.rank NOT IN (SELECT rank FROM step_ops) AND in_selected(s.step, f.first_step, p.step_lo, p.step_hi)
GROUP BY s.rank;
