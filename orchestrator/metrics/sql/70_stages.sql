-- Pipeline stages (layout known): mean compute per stage, the bubble (share of the window
-- with no compute kernel running; waiting send/recv counts as bubble), and the imbalance
-- between the heaviest and lightest stage.
-- Microbatches per step: --microbatches, else the job spec's layout.microbatches, else counted
-- from NVTX microbatch ranges (`forward mb3`, `microbatch 3`) of the first stage's steps, else
-- from the trace's P2P pattern: the first stage sends each microbatch's activations once a step
-- (NCCL's `ncclSend` ranges), so its sends per step are m (v*m interleaved over v virtual
-- stages). Theory (GPipe/1F1B): the bubble
-- is (p-1)/(m+p-1) of the step with p stages and m microbatches ((p-1)/(v*m+p-1) interleaved over
-- v = vpp virtual stages per rank): the schedule's own bubble; the
-- excess above it is what stragglers and unequal stages add (59_critical_path.sql names who).
-- Reads: rank_metrics, meta (layout), nvtx, steps, params. Provides:
--   _vpp(v)  virtual pipeline stages per rank (layout.vpp, 1 without)
--   microbatches(m, source, counted)  microbatches per step, where the number came from, and
--       whether it was counted from the trace (not stated by --microbatches or the spec)
--   stage_metrics(stage, ranks, compute_ns, bubble_pct, gpu_idle_pct, p2p_wait_ns, window_ns,
--                 peer_wait_pct, theory_bubble_pct, microbatches, excess_bubble_pct, microbatches_from,
--                 microbatches_counted)
--       per pipeline stage: compute, bubble, theory and excess; peer_wait_pct: the share of the
--       window its NCCL send/recv kernels waited for the peer stage (the part of the bubble that
--       is the pipeline's: the rest is the stage's own launch gaps and host work)
--   imbalance(ratio, slowest_stage, fastest_stage)   one row when there are >= 2 stages
--   layout_notes(note)   what a cp, ep or vpp layout names that the analysis does not look into
CREATE OR REPLACE TABLE _vpp AS
SELECT coalesce(max(TRY_CAST(json_extract(value, '$.vpp') AS INTEGER)), 1) AS v FROM meta WHERE key = 'layout';

CREATE OR REPLACE TABLE microbatches AS
WITH mb AS (
    SELECT n.rank, s.step, count(DISTINCT regexp_extract(n.text, '(?i)(?:mb|microbatch)[ _#:]*(\d+)', 1)) AS m
    FROM nvtx n JOIN steps s ON s.rank = n.rank AND n.start >= s.start AND n."end" <= s."end"
    WHERE n.domain_id = 0 AND regexp_matches(n.text, '(?i)(?:mb|microbatch)[ _#:]*\d+')
    GROUP BY n.rank, s.step
)
, sends AS (  -- NCCL sends per step on the first stage's ranks
    SELECT n.rank, s.step, count(*) AS m
    FROM nvtx n JOIN steps s ON s.rank = n.rank AND n.start >= s.start AND n.start < s."end"
    WHERE n.domain = 'NCCL' AND n.text = 'ncclSend'
      AND n.rank IN (SELECT rank FROM rank_metrics WHERE stage = 0)
    GROUP BY n.rank, s.step
)
, spec AS (
    SELECT max(TRY_CAST(json_extract(value, '$.microbatches') AS INTEGER)) AS spec_m FROM meta WHERE key = 'layout'
)
SELECT p.microbatches AS m, '--microbatches' AS source, false AS counted FROM params p
WHERE p.microbatches IS NOT NULL
UNION ALL
SELECT spec.spec_m, 'the job spec''s layout.microbatches', false FROM spec, params p
WHERE p.microbatches IS NULL AND spec.spec_m IS NOT NULL
UNION ALL
SELECT CAST(median(mb.m) AS INTEGER), 'NVTX microbatch ranges', true FROM mb, params p, spec
WHERE p.microbatches IS NULL AND spec.spec_m IS NULL HAVING count(*) > 0
UNION ALL
SELECT CAST(median(sends.m) / max(v.v) AS INTEGER), 'the first stage''s NCCL sends per step in the trace', true
FROM sends, params p, spec, _vpp v
WHERE p.microbatches IS NULL AND spec.spec_m IS NULL AND NOT EXISTS (SELECT 1 FROM mb) HAVING count(*) > 0;

CREATE OR REPLACE VIEW stage_metrics AS
WITH s AS (
    SELECT stage, list(rank ORDER BY rank) AS ranks, avg(compute_ns) AS compute_ns,
           round(avg(100.0 - compute_pct), 2) AS bubble_pct, round(avg(gpu_idle_pct), 2) AS gpu_idle_pct,
           avg(p2p_wait_ns) AS p2p_wait_ns, avg(window_ns) AS window_ns
    FROM rank_metrics
    WHERE stage IS NOT NULL
      AND (SELECT coalesce(json_extract(value, '$.known')::BOOLEAN, false) FROM meta WHERE key = 'layout')
    GROUP BY stage
)
SELECT s.*, CASE WHEN s.window_ns > 0 THEN round(100.0 * s.p2p_wait_ns / s.window_ns, 2) END AS peer_wait_pct,
       round(100.0 * (n.p - 1) / (v.v * m.m + n.p - 1), 2) AS theory_bubble_pct, m.m AS microbatches,
       round(s.bubble_pct - 100.0 * (n.p - 1) / (v.v * m.m + n.p - 1), 2) AS excess_bubble_pct,
       m.source AS microbatches_from, m.counted AS microbatches_counted
FROM s CROSS JOIN (SELECT count(*) AS p FROM s) n LEFT JOIN microbatches m ON true CROSS JOIN _vpp v;

-- What the layout names but the analysis does not look into, one line each for the report.
CREATE OR REPLACE VIEW layout_notes AS
WITH l AS (
    SELECT coalesce(TRY_CAST(json_extract(value, '$.cp') AS INTEGER), 1) AS cp,
           coalesce(TRY_CAST(json_extract(value, '$.ep') AS INTEGER), 1) AS ep,
           coalesce(TRY_CAST(json_extract(value, '$.vpp') AS INTEGER), 1) AS vpp
    FROM meta WHERE key = 'layout'
)
SELECT 'layout cp=' || cp || ': ranks are grouped by stage and tp index; the collectives of one context-parallel '
       || 'group (ring-attention all-gathers and send/recv) are matched with the rest of the stage''s dp*cp '
       || 'group by order, so their waits are approximate' AS note FROM l WHERE cp > 1
UNION ALL
SELECT 'layout ep=' || ep || ': expert-parallel all-to-alls are matched within the stage''s data-parallel group by '
       || 'order (approximate waits); the load of each expert is not analysed' FROM l WHERE ep > 1
UNION ALL
SELECT 'layout vpp=' || vpp || ': the bubble''s theory is (p-1)/(vpp*m+p-1) for the interleaved schedule; the '
       || 'virtual stages of a rank are not told apart' FROM l WHERE vpp > 1;

CREATE OR REPLACE VIEW imbalance AS
WITH s AS (SELECT * FROM stage_metrics)
SELECT round(max(compute_ns) / min(compute_ns), 3) AS ratio,
       arg_max(stage, (compute_ns, -stage)) AS slowest_stage, arg_min(stage, (compute_ns, stage)) AS fastest_stage
FROM s HAVING count(*) > 1 AND min(compute_ns) > 0;
