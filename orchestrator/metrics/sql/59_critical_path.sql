-- The critical path of every step across ranks: from the step's end (the rank whose work of
-- the step ends last) walk back through the waits of wait_edges: at each rank, the latest wait
-- that ended before the current point hands the walk to the rank it waited for, at the moment
-- that rank arrived. Between two waits a rank worked: a path segment. The walk stops at the
-- step's start (its earliest GPU work on any rank), so the first segment is work nobody waited
-- for. A rank never waits inside its segment, so whoever waited for it there (on the path or
-- off it: a DP peer at an all-reduce) waited for that segment's work. Excess enters the path in
-- a segment when the excess others waited for it there exceeds the excess of the wait that
-- started the segment (this rank had waited itself): a rank whose lateness is explained by its
-- own earlier wait passes the blame back and is a victim, whatever it did afterwards. DP, TP,
-- PP and microbatches are all just waits here.
-- Ties (two ranks ending a step, or putting the same excess on the path, at the same
-- nanosecond) go to the lowest rank: the report must not depend on the order rows are read in.
-- Reads: wait_nodes, wait_edges, step_ops, offstep_islands, ranks, first_step,
-- params, gap_attr, compute_islands, in_selected, overlapping. Provides:
--   cp_steps(step, rank, t0, t1)                 the step's span and the rank that ends it
--   cp_path(step, hop, id, upto)                 the nodes on the path, hop 0 = the last
--   cp_segments(step, hop, rank, s, e, in_excess_ns, out_excess_ns, created_ns, waited_for)
--       the work on the path after a node (which waited for waited_for, or did not wait);
--       created = the excess this segment put on the path
--   cp_segment_phase(step, hop, rank, what, ns)  what the segment's rank did: GPU idle by CPU
--       range (gap_attr), 'GPU compute' (compute kernels), compute launched between steps
--   cp_rank_step(step, rank, path_ns, created_ns, phase, phase_ns, waited_ns, waited_excess_ns)
--       per step and rank: time on the path, excess it put there, its dominant cause while
--       doing so, and the (excess) waiting it suffered in the step
--   cp_roots(step, rank, created_ns, phase, step_ns, share_pct, victims, saving_ns)   one row per
--       step with a root (none when no rank put a tenth of the step on the path); saving: what
--       the step would lose with the root at the others' pace
--   cp_composition(what, ns, pct)   what the paths are made of over all steps: the phases of
--       cp_segment_phase and `other` (the rest of the segments' time), with their share
--   cp_held_by(rank, steps, total_ns, per_held_ns, per_step_ns, saving_ns)   each root rank: the
--       steps it held up, the excess it put on them, per step it held up and per analysed step,
--       and what those steps would lose with it at the others' pace
CREATE OR REPLACE TABLE cp_steps AS
SELECT o.step, arg_max(o.rank, (o.e, -o.rank)) AS rank, min(o.s) AS t0, max(o.e) AS t1
FROM step_ops o JOIN first_step f USING (rank), params p
WHERE o.step IS NOT NULL AND in_selected(o.step, f.first_step, p.step_lo, p.step_hi)
GROUP BY o.step
HAVING count(DISTINCT o.rank) > 1;

-- The walk: hop 0 is the end rank's last node before the step's end; each hop follows pred
-- (to the rank waited for, or back along the same rank) while the step has time left before it.
-- A path row is a node and the work after it on its rank, up to where the walk came from.
CREATE OR REPLACE TABLE cp_path AS
WITH RECURSIVE first AS (
    SELECT s.step, w.id, s.t1 AS upto FROM cp_steps s
    ASOF JOIN (SELECT rank, s, id FROM wait_nodes) w ON w.rank = s.rank AND s.t1 > w.s
), walk(step, hop, id, upto) AS (
    SELECT step, 0, id, upto FROM first
    UNION ALL
    SELECT k.step, k.hop + 1, w.pred, CASE WHEN w.waited_for <> w.rank THEN w.e ELSE w.s END
    FROM walk k JOIN wait_nodes w ON w.id = k.id JOIN cp_steps s ON s.step = k.step
    WHERE w.pred IS NOT NULL AND (CASE WHEN w.waited_for <> w.rank THEN w.e ELSE w.s END) > s.t0
      AND k.hop < 1000000
)
SELECT * FROM walk;

CREATE OR REPLACE TABLE cp_segments AS
WITH seg AS (
    SELECT k.step, k.hop, w.rank, greatest(w.e, s.t0) AS s, k.upto AS e,
           CASE WHEN w.step = k.step THEN w.carried_ns ELSE 0 END AS in_excess_ns,  -- a step starts afresh
           CASE WHEN w.waited_for <> w.rank THEN w.waited_for END AS waited_for
    FROM cp_path k JOIN wait_nodes w ON w.id = k.id JOIN cp_steps s ON s.step = k.step
    WHERE k.upto > w.e
    UNION ALL  -- the walk ran out of nodes (the first analysed step): the work before the last one
    SELECT k.step, k.hop + 1, w.waited_for, s.t0, x.at_t, 0, NULL
    FROM cp_path k JOIN wait_nodes w ON w.id = k.id JOIN cp_steps s ON s.step = k.step,
    LATERAL (SELECT CASE WHEN w.waited_for <> w.rank THEN w.e ELSE w.s END AS at_t) x
    WHERE w.pred IS NULL AND x.at_t > s.t0
), caused AS (  -- the segment's rank made others wait in it (it never waits inside a segment); a
    -- waiter is back in step after each wait, so its waits add up; two waiters held up by the
    -- same lateness (a DP peer and the next stage) are one delay: the worst waiter counts. A
    -- wait's excess is its last excess_ns, and only the part of it inside the segment is the
    -- segment's: a wait that began while the rank was in an earlier segment (late for its input)
    -- and ends in this one (after it waited for a third rank) was made in the earlier one
    SELECT step, hop, max(ns) AS ns FROM (
        SELECT seg.step, seg.hop, w.rank, sum(least(w.e, seg.e) - greatest(w.e - w.excess_ns, seg.s)) AS ns
        FROM seg JOIN wait_edges w ON w.step = seg.step AND w.waited_for = seg.rank AND w.e > seg.s
            AND w.e - w.excess_ns < seg.e
        GROUP BY ALL)
    GROUP BY ALL
)
SELECT seg.step, seg.hop, seg.rank, seg.s, seg.e, seg.in_excess_ns, coalesce(c.ns, 0) AS out_excess_ns,
       greatest(coalesce(c.ns, 0) - seg.in_excess_ns, 0) AS created_ns, seg.waited_for
FROM seg LEFT JOIN caused c USING (step, hop);

-- Compute launched outside every step range (offstep_islands: metrics, evaluation, logging
-- between steps) is that work, not the step's: it counts as `between steps (other work)`.
CREATE OR REPLACE TABLE cp_segment_phase AS
WITH seg AS (SELECT step, hop, rank, s AS start, e AS "end" FROM cp_segments WHERE e > s),
ci AS (  -- the path's ranks only: a step's path crosses a few of the job's ranks
    SELECT rank, s, e FROM compute_islands WHERE rank IN (SELECT rank FROM seg)),
bs AS (SELECT rank, s, e FROM offstep_islands WHERE rank IN (SELECT rank FROM seg)),
idle AS (
    SELECT o.step, o.hop, o.rank, g.range_group AS what, sum(least(o."end", o.d_e) - greatest(o.start, o.d_s)) AS ns
    FROM overlapping('gap_attr', 'seg') o
    JOIN gap_attr g ON g.rank = o.rank AND g.s = o.d_s
    GROUP BY ALL
), comp AS (
    SELECT step, hop, rank, 'GPU compute' AS what, sum(least("end", d_e) - greatest(start, d_s)) AS ns
    FROM overlapping('ci', 'seg')
    GROUP BY ALL
), between AS (
    SELECT step, hop, rank, 'between steps (other work)' AS what, sum(least("end", d_e) - greatest(start, d_s)) AS ns
    FROM overlapping('bs', 'seg')
    GROUP BY ALL
)
SELECT step, hop, rank, what, sum(ns) AS ns  -- (between-steps compute is not GPU compute twice)
FROM (SELECT * FROM idle UNION ALL SELECT * FROM comp UNION ALL SELECT * FROM between
      UNION ALL SELECT step, hop, rank, 'GPU compute', -ns FROM between)
GROUP BY ALL HAVING sum(ns) > 0;

CREATE OR REPLACE TABLE cp_rank_step AS
WITH seg AS (
    SELECT step, rank, sum(e - s) AS path_ns, sum(created_ns) AS created_ns FROM cp_segments GROUP BY ALL
), ph AS (  -- GPU idle by CPU range in the segments where this rank put excess on the path
    SELECT c.step, c.rank, p.what, sum(p.ns) AS ns
    FROM cp_segments c JOIN cp_segment_phase p USING (step, hop, rank)
    WHERE c.created_ns > 0 AND p.what <> 'GPU compute' GROUP BY ALL
), top AS (  -- the range whose idle explains at least half the excess, else the GPU was computing
    SELECT s.step, s.rank,
           CASE WHEN 2 * max(ph.ns) >= s.created_ns THEN arg_max(ph.what, (ph.ns, ph.what)) ELSE 'GPU compute' END AS phase,
           CASE WHEN 2 * max(ph.ns) >= s.created_ns THEN max(ph.ns) END AS phase_ns
    FROM seg s LEFT JOIN ph USING (step, rank) WHERE s.created_ns > 0 GROUP BY s.step, s.rank, s.created_ns
), waited AS (
    SELECT step, rank, sum(wait_ns) AS waited_ns, sum(excess_ns) AS waited_excess_ns
    FROM wait_edges WHERE step IN (SELECT step FROM cp_steps) GROUP BY ALL
)
SELECT coalesce(seg.step, waited.step) AS step, coalesce(seg.rank, waited.rank) AS rank,
       coalesce(seg.path_ns, 0) AS path_ns, coalesce(seg.created_ns, 0) AS created_ns,
       top.phase, coalesce(top.phase_ns, 0) AS phase_ns,
       coalesce(waited.waited_ns, 0) AS waited_ns, coalesce(waited.waited_excess_ns, 0) AS waited_excess_ns
FROM seg FULL JOIN waited USING (step, rank) LEFT JOIN top USING (step, rank);

-- The step's root: the rank that put the most excess on the path, when that excess is at
-- least a tenth of the step's span and 1 ms (the small waits of a healthy job stay below); its
-- victims: every other rank that waited for a quarter of that excess or more in the step.
-- saving: what the step would lose if the root kept the others' pace, its finding's cost. "The
-- others" are the other ranks of the root's pipeline stage (every rank without stages), which
-- do the same work: each lost the time its GPU sat without compute while it waited for the
-- root. A DDP bucket's all-reduce that waits while backward goes on computing delays nothing,
-- the buffer broadcast that forward needs, or the last all-reduce the optimizer needs, does.
-- With the root at their pace, its stage and the stages that wait on it run at theirs: the step
-- shortens by what they lost, the median over them, as one rank's loss can fall outside its
-- waits for the root (the source of a small broadcast, whose kernel ends without waiting for
-- the receivers, goes on and loses its time later). With stages, the peers are those that
-- waited for the root in the step (their collectives); where none did (a stage of one rank, or
-- no collective within the stage) there is no pace to compare with: the step's end is a chain
-- of sends and receives, and the saving the excess the root put on the path.
CREATE OR REPLACE TABLE cp_roots AS
WITH r AS (
    SELECT c.step, arg_max(c.rank, (c.created_ns, -c.rank)) AS rank, max(c.created_ns) AS created_ns,
           arg_max(c.phase, (c.created_ns, -c.rank)) AS phase, any_value(s.t1 - s.t0) AS step_ns
    FROM cp_rank_step c JOIN cp_steps s USING (step) GROUP BY c.step
), waits AS (  -- the others' waits for the step's root
    SELECT w.step, w.rank, w.s AS start, w.e AS "end"
    FROM wait_edges w JOIN r ON r.step = w.step AND w.waited_for = r.rank WHERE w.e > w.s
), ends AS (  -- each wait's two ends, its start counted off
    SELECT step, rank, start, start AS t, -1 AS sign FROM waits
    UNION ALL
    SELECT step, rank, start, "end", 1 FROM waits
), busy AS (  -- the compute inside each wait: up to its end less up to its start, where up to t is
    -- the last island starting at or before t up to its end, less its part after t (one lookup
    -- for both ends: the islands are sorted once)
    SELECT p.step, p.rank, p.start, sum(p.sign * coalesce(c.upto - greatest(c.e - p.t, 0), 0)) AS ns
    FROM ends p ASOF LEFT JOIN compute_islands c ON c.rank = p.rank AND p.t >= c.s
    GROUP BY ALL
), peers AS (  -- per step, the other ranks of the root's stage; with stages, those that waited for it
    SELECT c.step, c.rank FROM (SELECT DISTINCT step, rank FROM wait_nodes) c
    JOIN r ON r.step = c.step AND c.rank <> r.rank
    JOIN ranks a ON a.rank = r.rank JOIN ranks b ON b.rank = c.rank AND b.stage IS NOT DISTINCT FROM a.stage
    WHERE (SELECT count(DISTINCT stage) FROM ranks) < 2
       OR EXISTS (SELECT 1 FROM waits w WHERE w.step = c.step AND w.rank = c.rank)
), lost AS (  -- per step and peer: its GPU without compute while it waited for the root
    SELECT c.step, c.rank, sum(coalesce(w."end" - w.start - b.ns, w."end" - w.start, 0)) AS ns
    FROM peers c
    LEFT JOIN waits w ON w.step = c.step AND w.rank = c.rank
    LEFT JOIN busy b ON b.step = w.step AND b.rank = w.rank AND b.start = w.start
    GROUP BY ALL
), pace AS (SELECT step, median(ns) AS ns FROM lost GROUP BY step)
SELECT r.step, r.rank, r.created_ns, r.phase, r.step_ns,
       round(100.0 * r.created_ns / r.step_ns, 2) AS share_pct,
       coalesce((SELECT list(v.rank ORDER BY v.rank) FROM cp_rank_step v
                 WHERE v.step = r.step AND v.rank <> r.rank AND 4 * v.waited_excess_ns >= r.created_ns),
                []) AS victims,
       CASE WHEN e.step IS NULL THEN r.created_ns ELSE least(r.created_ns, e.ns) END AS saving_ns
FROM r LEFT JOIN pace e USING (step) WHERE 10 * r.created_ns >= r.step_ns AND r.created_ns >= 1000000;

CREATE OR REPLACE TABLE cp_composition AS
WITH seg AS (SELECT sum(e - s) AS ns FROM cp_segments WHERE e > s),
ph AS (SELECT what, sum(ns) AS ns FROM cp_segment_phase GROUP BY what),
parts AS (
    SELECT what, ns FROM ph
    UNION ALL
    SELECT 'other', greatest((SELECT ns FROM seg) - coalesce((SELECT sum(ns) FROM ph), 0), 0)
), total AS (SELECT sum(ns) AS ns FROM parts)
SELECT p.what, p.ns, CASE WHEN t.ns > 0 THEN round(100.0 * p.ns / t.ns, 2) ELSE 0.0 END AS pct
FROM parts p, total t WHERE p.ns IS NOT NULL;

CREATE OR REPLACE TABLE cp_held_by AS
SELECT rank, count(*) AS steps, sum(created_ns) AS total_ns, avg(created_ns) AS per_held_ns,
       sum(created_ns) / (SELECT count(*) FROM cp_steps) AS per_step_ns, sum(saving_ns) AS saving_ns
FROM cp_roots GROUP BY rank
ORDER BY total_ns DESC, rank;
