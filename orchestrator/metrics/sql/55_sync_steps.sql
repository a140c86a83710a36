-- Where the GPU idled after the host syncs (55_host_sync.sql), and in which steps they were made,
-- on every rank.
-- Reads: sync_idle, gap_attr, host_syncs, steps, first_step, params, overlapping, in_selected.
-- Provides:
--   sync_idle_ranges(rank, range_group, ns)  that idle by the CPU range it was spent in
--   sync_steps(rank, step, n)  the rank's selected iterations that hold a sync, and their syncs (each sync in
--       the last step that started before it: a `.item()` between two step ranges is its step's): syncs every
--       step, or a few steps' many (torch.save copying each tensor of a checkpoint to the host)

-- Where the CPU was while the GPU idled after a sync: the GPU gaps (gap_attr) inside each
-- sync's idle interval, by CPU range. Idle spent in an input-pipeline range is reported as
-- a data-loader stall, not again as a sync cost.
CREATE OR REPLACE VIEW sync_idle_ranges AS
WITH iv AS (SELECT rank, "end" AS start, "end" + idle_ns AS "end" FROM sync_idle WHERE idle_ns > 0)
SELECT o.rank, g.range_group, sum(least(o.d_e, o."end") - greatest(o.d_s, o.start)) AS ns
FROM overlapping('gap_attr', 'iv') o JOIN gap_attr g ON g.rank = o.rank AND g.s = o.d_s
GROUP BY ALL;

CREATE OR REPLACE VIEW sync_steps AS
SELECT h.rank, s.step, count(*) AS n
FROM host_syncs h ASOF JOIN steps s ON s.rank = h.rank AND s.start <= h.start
JOIN first_step f ON f.rank = h.rank, params p
WHERE in_selected(s.step, f.first_step, p.step_lo, p.step_hi)
GROUP BY h.rank, s.step;
