-- CPU phases: per rank, mean time per selected step spent in each default-domain NVTX range
-- group, as self time (minus directly nested ranges) so that a parent such as `forward` is
-- not blamed for the `data_load` inside it; offset = where in the step it runs, on average.
-- Computed for CPU-only ranks (no GPU activity captured), where it is all there is. Over the
-- complete steps only, as the step times (60_step_times.sql): a rank's last step may have been
-- cut by a hang, a time limit or a failure, and its phases then last until the capture ended.
-- Reads: steps, first_step, win, cpu_ranges, nvtx, params, step_gpu,
-- in_selected, range_group. Provides:
--   cpu_phases(rank, grp, ns_per_step, offset_ns, step_ns, n_steps)
--       per rank and range group, self time per selected step
--   _selected_steps(rank, tid, start, end, step, family)  the selected, complete steps
CREATE OR REPLACE TABLE _selected_steps AS
SELECT s.* FROM steps s JOIN first_step f USING (rank), params p
WHERE s.rank IN (SELECT rank FROM win WHERE source = 'steps (cpu only)')
  AND in_selected(s.step, f.first_step, p.step_lo, p.step_hi)
  AND (s.rank, s.step) IN (SELECT (rank, step) FROM step_gpu WHERE complete);

CREATE OR REPLACE TABLE cpu_phases AS
WITH child AS (
    SELECT p.rank, p.tid, p.start, sum(c."end" - c.start) AS ns
    FROM (SELECT * FROM cpu_ranges WHERE rank IN (SELECT rank FROM _selected_steps)) p JOIN nvtx c
      ON c.rank = p.rank AND c.tid = p.tid AND c.domain_id = 0 AND c.depth = p.depth + 1
     AND c.start >= p.start AND c."end" <= p."end"
    GROUP BY ALL
), n AS (
    SELECT rank, count(*) AS n_steps, avg("end" - start) AS step_ns FROM _selected_steps GROUP BY rank
)
SELECT c.rank, range_group(t.text) AS grp,
       sum(c."end" - c.start - coalesce(ch.ns, 0)) / any_value(n.n_steps) AS ns_per_step,
       avg(c.start - s.start) AS offset_ns, any_value(n.step_ns) AS step_ns, any_value(n.n_steps) AS n_steps
FROM cpu_ranges c JOIN nvtx t ON t.rowid = c.nvtx_row
JOIN _selected_steps s ON s.rank = c.rank AND s.tid = c.tid AND c.start >= s.start AND c."end" <= s."end"
LEFT JOIN child ch ON ch.rank = c.rank AND ch.tid = c.tid AND ch.start = c.start
JOIN n ON n.rank = c.rank
GROUP BY c.rank, range_group(t.text);
