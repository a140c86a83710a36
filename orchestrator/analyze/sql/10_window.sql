-- Steady-state window per rank.
-- steps: NVTX ranges named `step N` / `Step N` / `iteration N` (default domain).
-- gpu_ops: every kernel/memcpy/memset with the step its CUDA launch happened in (the
--   launching thread's innermost step range), NULL when launched outside any step.
-- win: [first start, last end] of GPU work launched inside the selected steps (by default
--   all steps but each rank's first); with no step ranges, the whole capture.
CREATE OR REPLACE TEMP TABLE steps AS
SELECT rank, tid, start, "end",
       CAST(regexp_extract(text, '^(?:[Ss]tep|[Ii]teration)[ _#:]*(\d+)$', 1) AS INTEGER) AS step
FROM nvtx
WHERE domain_id = 0 AND regexp_matches(text, '^(?:[Ss]tep|[Ii]teration)[ _#:]*\d+$');

CREATE OR REPLACE TEMP TABLE gpu_raw AS
SELECT rank, 'kernel' AS kind, CASE WHEN short_name LIKE 'nccl%' THEN 'comm' ELSE 'compute' END AS category, start, "end", correlation_id, short_name AS name FROM kernels
UNION ALL
SELECT rank, 'memcpy', 'memory', start, "end", correlation_id, 'memcpy ' || kind FROM memcpy
UNION ALL
SELECT rank, 'memset', 'memory', start, "end", correlation_id, 'memset' FROM memset;

CREATE OR REPLACE TEMP TABLE launch_step AS
SELECT a.rank, a.correlation_id, max(s.step) AS step
FROM cuda_api a JOIN steps s
  ON s.rank = a.rank AND s.tid = a.tid AND a.start >= s.start AND a.start < s."end"
WHERE a.correlation_id IS NOT NULL
GROUP BY a.rank, a.correlation_id;

CREATE OR REPLACE TEMP TABLE gpu_ops AS
SELECT g.*, l.step FROM gpu_raw g
LEFT JOIN launch_step l ON l.rank = g.rank AND l.correlation_id = g.correlation_id;

CREATE OR REPLACE TEMP TABLE first_step AS
SELECT rank, min(step) AS first_step FROM steps GROUP BY rank;

CREATE OR REPLACE TEMP TABLE selected_ops AS
SELECT o.* FROM gpu_ops o JOIN first_step f USING (rank), params p
WHERE o.step IS NOT NULL
  AND CASE WHEN p.step_lo IS NULL THEN o.step > f.first_step
           ELSE o.step BETWEEN p.step_lo AND p.step_hi END;

CREATE OR REPLACE TEMP TABLE win AS
SELECT rank, min(start) AS w0, max("end") AS w1, 'steps' AS source FROM selected_ops GROUP BY rank
UNION ALL
-- Ranks without step ranges (or whose steps launched no GPU work): the whole capture.
SELECT rank, min(start), max("end"), 'capture' FROM gpu_ops
WHERE rank NOT IN (SELECT rank FROM selected_ops) GROUP BY rank
UNION ALL
-- CPU-only captures: the selected steps' NVTX span.
SELECT s.rank, min(s.start), max(s."end"), 'steps (cpu only)' FROM steps s JOIN first_step f USING (rank), params p
WHERE s.rank NOT IN (SELECT rank FROM gpu_ops)
  AND CASE WHEN p.step_lo IS NULL THEN s.step > f.first_step ELSE s.step BETWEEN p.step_lo AND p.step_hi END
GROUP BY s.rank;
