-- Each rank's own GPU work replayed with some of its CPU's time gone: the what-ifs of a job with
-- no collectives to replay across ranks (one GPU, a CPU job; 61_replay.sql replays the others),
-- which need the rank's own events only.
-- Map: per rank
-- Reads: gpu_ops, win, host_syncs, cpu_ranges, nvtx, loop_thread, between_steps, params, range_group.
-- Provides:
--   own_replay(rank INTEGER, what VARCHAR, removed_ns BIGINT, saving_ns BIGINT)  per rank and what-if
--       that removes something on it: `host syncs` (the CPU time blocked in host_syncs) and `input`
--       (the loop thread's time in input-pipeline ranges, params.input_re, never a range named after a
--       call, and between NVTX steps where it did no other work, between_steps: the batch there at once).
--       Its GPU ops inside the window in start order, each one no earlier than the previous op's end
--       plus the gap it had (at most 2 us, how far apart a GPU runs queued work: an op that ran from the
--       queue stays queued), and one that waited for its launch (a longer gap) no earlier than its start
--       moved back by the removed CPU time that ended before it: without it the CPU, and so its
--       launches, runs that much ahead. The unchanged trace (nothing moved back) replays exactly.
--       removed_ns: the CPU time removed inside the window; saving_ns: the latest end of its ops less the
--       latest replayed end, what the GPU's work in the window would take less. That counts the GPU's
--       idle while the CPU was away and the launch gaps after it until the CPU is ahead again

-- The removed CPU time: the loop thread's input intervals, merged where nested or overlapping (a
-- user's `data_load` inside orch's `orch: next batch`) and cut to the window, and the host syncs;
-- per what-if, its running total at each interval's end (upto), read by the replay's join and the totals.
-- The ends replayed, op k of a rank: e'_k = max(a_k, e'_(k-1) + b_k), a_k = its start less the removed
-- time before it plus its length (NULL for a queued op: its launch came before the GPU got to it, and
-- moving the CPU back keeps it so), b_k = the gap it may keep plus its length. Unrolled, e'_n =
-- T_n + max over k <= n of (a_k - T_k), T the running sum of b: window sums, no loop over ops. T is
-- the same for every what-if, so one pass over the ops replays them all (a column each).
-- 2 us: a GPU runs queued work about a microsecond apart (docs/report.md), so an op after a longer
-- gap waited for its launch. Running sums are DOUBLE (exact below 2^53 ns).
CREATE OR REPLACE TABLE own_replay AS
WITH grp AS (  -- the input's range groups: the pattern, a parameter, is compiled once a group
    SELECT g FROM (SELECT DISTINCT range_group(n.text) AS g FROM cpu_ranges c JOIN nvtx n ON n.rowid = c.nvtx_row),
         params p
    WHERE regexp_matches(g, p.input_re) AND NOT starts_with(g, p.call_gap)
), rng AS (
    SELECT c.rank, c.start, c."end" FROM cpu_ranges c JOIN loop_thread l USING (rank, tid)
    JOIN nvtx n ON n.rowid = c.nvtx_row
    WHERE c."end" IS NOT NULL AND range_group(n.text) IN (SELECT g FROM grp)
    UNION ALL
    SELECT rank, s, e FROM between_steps WHERE NOT other_work
), cut AS (
    SELECT r.rank, greatest(r.start, w.w0) AS start, least(r."end", w.w1) AS "end"
    FROM rng r JOIN win w USING (rank) WHERE r."end" > w.w0 AND r.start < w.w1
), ordered AS (
    SELECT *, max("end") OVER (PARTITION BY rank ORDER BY start, "end"
                               ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS reach
    FROM cut
), islands AS (  -- a new island where an interval starts past every earlier one's end
    SELECT *, sum(CASE WHEN reach IS NULL OR start > reach THEN 1 ELSE 0 END)
                  OVER (PARTITION BY rank ORDER BY start, "end" ROWS UNBOUNDED PRECEDING) AS k
    FROM ordered
), removed AS (
    SELECT rank, 'input' AS what, min(start) AS start, max("end") AS "end" FROM islands GROUP BY rank, k
    UNION ALL
    SELECT rank, 'host syncs', start, "end" FROM host_syncs
), per_end AS (
    SELECT rank, what, "end", sum(CAST("end" - start AS DOUBLE)) AS ns FROM removed GROUP BY ALL
), removed_upto AS MATERIALIZED (
    SELECT rank, what, "end", sum(ns) OVER (PARTITION BY rank, what ORDER BY "end" ROWS UNBOUNDED PRECEDING) AS upto
    FROM per_end
), ops AS (
    SELECT o.rank, o.start, o."end", o."end" - o.start AS d,
           o.start - lag(o."end") OVER (PARTITION BY o.rank ORDER BY o.start, o."end") AS gap
    FROM gpu_ops o JOIN win w USING (rank) WHERE o.start >= w.w0 AND o.start < w.w1
), ends AS (  -- both what-ifs' totals at each end, carried forward (each only grows): one ASOF join
    SELECT rank, "end", max(max(upto) FILTER (WHERE what = 'host syncs')) OVER w AS back_s,
           max(max(upto) FILTER (WHERE what = 'input')) OVER w AS back_i
    FROM removed_upto GROUP BY rank, "end" WINDOW w AS (PARTITION BY rank ORDER BY "end" ROWS UNBOUNDED PRECEDING)
), moved AS (
    SELECT o.*, coalesce(x.back_s, 0) AS back_s, coalesce(x.back_i, 0) AS back_i FROM ops o
    ASOF LEFT JOIN ends x ON x.rank = o.rank AND x."end" <= o.start
), t AS (
    SELECT rank, start, "end", back_s, back_i, CASE WHEN gap IS NULL OR gap > 2000 THEN start + d END AS a,
           sum(CAST(least(coalesce(gap, 0), 2000) + d AS DOUBLE))
               OVER (PARTITION BY rank ORDER BY start, "end" ROWS UNBOUNDED PRECEDING) AS tb
    FROM moved
), replayed AS (
    SELECT rank, "end", tb + max(a - back_s - tb) OVER w AS e_s, tb + max(a - back_i - tb) OVER w AS e_i
    FROM t WINDOW w AS (PARTITION BY rank ORDER BY start, "end" ROWS UNBOUNDED PRECEDING)
), per AS (
    SELECT rank, max("end") - max(e_s) AS saving_s, max("end") - max(e_i) AS saving_i FROM replayed GROUP BY rank
), whats AS (SELECT rank, what, max(upto) AS removed FROM removed_upto GROUP BY ALL)
SELECT x.rank, x.what, CAST(round(x.removed) AS BIGINT) AS removed_ns,
       coalesce(CAST(round(CASE x.what WHEN 'input' THEN p.saving_i ELSE p.saving_s END) AS BIGINT), 0) AS saving_ns
FROM whats x LEFT JOIN per p USING (rank);
