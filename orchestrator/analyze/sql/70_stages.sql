-- Pipeline stages (layout known): mean compute per stage, the bubble (share of the window
-- with no compute kernel running; waiting send/recv counts as bubble), and the imbalance
-- between the heaviest and lightest stage.
-- Reads: rank_metrics, meta (layout). Provides:
--   stage_metrics(stage, ranks, compute_ns, bubble_pct, gpu_idle_pct)
--   imbalance(ratio, slowest_stage, fastest_stage)   one row when there are >= 2 stages
CREATE OR REPLACE TEMP VIEW stage_metrics AS
SELECT stage, list(rank ORDER BY rank) AS ranks, avg(compute_ns) AS compute_ns,
       round(avg(100.0 - compute_pct), 2) AS bubble_pct, round(avg(gpu_idle_pct), 2) AS gpu_idle_pct
FROM rank_metrics
WHERE stage IS NOT NULL AND (SELECT coalesce(json_extract(value, '$.known')::BOOLEAN, false) FROM meta WHERE key = 'layout')
GROUP BY stage;

CREATE OR REPLACE TEMP VIEW imbalance AS
WITH s AS (SELECT * FROM stage_metrics)
SELECT round(max(compute_ns) / min(compute_ns), 3) AS ratio,
       arg_max(stage, compute_ns) AS slowest_stage, arg_min(stage, compute_ns) AS fastest_stage
FROM s HAVING count(*) > 1 AND min(compute_ns) > 0;
