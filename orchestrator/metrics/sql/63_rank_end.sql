-- Where each rank stood when its capture ended, for a job that did not end by itself (a hang,
-- a time limit, a cancel, a failed rank). nsys closes the ranges still open when it stops, at
-- the moment it stops: they are the ranges of the loop thread that end within 2 ms of its last
-- range's end. last_done_step is the last step that ended before that; a rank's furthest phase
-- is, among the child ranges of its last step, the one that starts latest in a finished step
-- (job-wide median offset from the step's start, over each rank's 3 steps before it): where
-- the ranks' furthest phases differ, the ranks behind never reached what the others waited in.
-- still_ns is how long before its end the loop thread last began a range (how long the rank
-- showed no progress) and step_ns its median step time (step_stats): a rank behind that began a
-- range a moment before a stop was still running, not hung.
-- A rank whose threads made OS-runtime or CUDA calls after its loop thread's last range ended
-- (by more than after_loop_min_ns()) closed that range itself: nsys closes a range only at the
-- capture's end, after every other call it recorded. Where its last step also reached the phase
-- that comes last in the loop's steps (an exception that unwinds the ranges closes them in an
-- earlier one: where it failed), it finished that step and ran on outside the ranges for
-- ran_on_ns (to the end of its last call), still_ns counted to there: a rank that finished its
-- loop and never exited (a hang in teardown or at the interpreter's exit) is told from one
-- stopped inside a step.
-- Reads: nvtx, every_step, step_stats, last_call. Provides:
--   rank_end(rank, end_ns, last_step, last_done_step, open_ranges, furthest, furthest_offset_ns,
--            still_ns, step_ns, ran_on_ns)
--       per rank, where it stood when the capture ended
--   after_loop_min_ns()
--       how long after the loop's last range a call must end to show the program closed it
CREATE OR REPLACE MACRO after_loop_min_ns() AS 100000000;

CREATE OR REPLACE TABLE rank_end AS
WITH loop AS (
    SELECT rank, tid, max(step) AS last_step FROM every_step GROUP BY rank, tid
), fin AS (
    SELECT n.rank, l.tid, l.last_step, max(n."end") AS end_ns, max(n.start) AS last_start_ns
    FROM nvtx n JOIN loop l ON n.rank = l.rank AND n.tid = l.tid
    WHERE n.domain_id = 0 GROUP BY n.rank, l.tid, l.last_step
), recent AS (  -- the last steps, with the depth of their own range
    SELECT s.rank, s.tid, s.step, s.start, s."end", f.last_step, sn.depth
    FROM every_step s JOIN fin f ON s.rank = f.rank AND s.tid = f.tid
    JOIN nvtx sn ON sn.rank = s.rank AND sn.tid = s.tid AND sn.start = s.start AND sn."end" = s."end"
     AND sn.domain_id = 0
    WHERE s.step BETWEEN f.last_step - 3 AND f.last_step
), kids AS (
    SELECT r.rank, r.step, r.last_step, n.text, n.start - r.start AS off
    FROM recent r JOIN nvtx n ON n.rank = r.rank AND n.tid = r.tid AND n.domain_id = 0
     AND n.depth = r.depth + 1 AND n.start >= r.start AND n.start < r."end"
    WHERE n.text IS NOT NULL
), typical AS (
    SELECT text, median(off) AS off FROM kids WHERE step < last_step GROUP BY text
), furthest AS (
    SELECT k.rank, arg_max(k.text, (t.off, k.text)) AS furthest, max(t.off) AS furthest_offset_ns
    FROM kids k JOIN typical t USING (text) WHERE k.step = k.last_step GROUP BY k.rank
), ran AS (  -- an exception that unwinds the ranges closes them too, in a phase before the step's last
    SELECT f.rank, c.end_ns - f.end_ns AS ran_on_ns
    FROM fin f JOIN last_call c USING (rank) LEFT JOIN furthest u USING (rank)
    WHERE c.end_ns - f.end_ns > after_loop_min_ns()
      AND (u.furthest_offset_ns IS NULL OR u.furthest_offset_ns >= (SELECT max(off) FROM typical))
), opened AS (
    SELECT n.rank, list(n.text ORDER BY n.depth, n.start) AS open_ranges
    FROM nvtx n JOIN fin f ON n.rank = f.rank AND n.tid = f.tid
    WHERE n.domain_id = 0 AND n.text IS NOT NULL AND n."end" >= f.end_ns - 2000000
      AND f.rank NOT IN (SELECT rank FROM ran)
    GROUP BY n.rank
), done AS (
    SELECT s.rank, max(s.step) AS last_done_step
    FROM every_step s JOIN fin f ON s.rank = f.rank AND s.tid = f.tid LEFT JOIN ran r ON r.rank = s.rank
    WHERE s."end" < f.end_ns - 2000000 OR r.rank IS NOT NULL GROUP BY s.rank
)
SELECT f.rank, f.end_ns, f.last_step, d.last_done_step, o.open_ranges, u.furthest,
       CAST(u.furthest_offset_ns AS BIGINT) AS furthest_offset_ns,
       f.end_ns + coalesce(r.ran_on_ns, 0) - f.last_start_ns AS still_ns,
       CAST(p.median_ns AS BIGINT) AS step_ns, r.ran_on_ns
FROM fin f LEFT JOIN done d USING (rank) LEFT JOIN opened o USING (rank) LEFT JOIN furthest u USING (rank)
LEFT JOIN step_stats p USING (rank) LEFT JOIN ran r USING (rank);
