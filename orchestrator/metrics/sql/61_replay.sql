-- A replay of the job and what-ifs on it (after Lumos, MLSys'25, and the straggler what-if of
-- ByteDance's study, OSDI'25). The graph: each rank's NCCL kernels in order, a node each. A rank
-- reaches a node after its own work since its previous node ended (w: compute, input, host
-- syncs, launch gaps: all it did alone), and not before its CPU launched it: its CPU's own time
-- since the previous launch (dc; what its shorter calls waited for room in the launch queue is
-- the GPU's, queue_wait), or, where the CPU blocked on its GPU in between (any CUDA call
-- of a millisecond or more: a sync, a launch into a full queue), after that block returned:
-- when the CPU got there (pre, then post after it), or when the GPU let it go (gw, counted from
-- the previous node's end, which it moves with; a sync whose GPU work followed the CPU moves
-- with the CPU). A rank that waited for a straggler ran its queued work back to back afterwards;
-- without the straggler its own CPU's launches bound it. A node ends when its instance's last
-- member arrives plus the instance's transfer (the last arriver's kernel; a collective: every
-- rank of its communicator; a send/recv: the matched pair); a kernel that ended before its
-- instance's last member started waited for nobody (a buffered send, a broadcast's root) and
-- takes its own length. A step ends when its last node ends, and lasts from the previous step's
-- end: the work after a step's last node is the next step's, counted once.
-- The unchanged replay against the measured steps is the replay's error. A what-if replays with
-- one cause removed; what it saves is the unchanged replay's steps minus the what-if's, over the
-- analysed steps. `rank <r>`: the rank's own work, CPU time between launches and CPU time around
-- its blocks at the median of its stage's other ranks at the same place of the same step (alone
-- in its stage: its own median over the steps), never slower than it was; up to 32 ranks, those
-- that held someone up (below) whose own work exceeds their peers' the most, then the others.
-- `stages balanced` (a pipeline): every rank's own work and its CPU times each scaled to the
-- stages' mean, the same work split evenly between the stages; what it saves is what unequal
-- stages cost, the bubble above the schedule's own with these transfers and these forward and
-- backward costs. `input on time`: every
-- rank's GPU idle waiting for input (gaps in an input-pipeline range or between steps for the
-- next batch) removed, from its GPU work and from its CPU's time before the launch. `no host
-- syncs`: every block that waited for the GPU's work gone (the CPU runs on), and the GPU's idle
-- after it. `ranks not profiled on time`: where a profiled rank's collectives have members without a
-- report (profile.ranks chose a few), no instance matches them and their wait reads as the rank's
-- own work; the what-if takes out of it the wait above what the other profiled ranks wait in
-- communicators of the same size and kernel (coll_unseen).
-- Reads: coll, p2p_match, step_ops, comm_ops, steps, cpu_blocks, queue_wait, gap_attr, sync_idle, loo_ref, ranks, meta,
-- first_step, params, in_selected, win, nccl_kernel_comm, nccl_comm_size, comm_bytes, compute_islands, overlapping,
-- is_p2p, is_comm.
-- Provides:
--   replay_nodes(rank, step, pos, gpos, inst, s, e, w, t, dur, buffered, l, anchor, lp, dc, pre, bw, post, gw,
--                bsync)
--       the graph: per rank its nodes in order (pos in the step, gpos in the capture), the
--       instance, the observed start and end, the own work before it (w), the instance's
--       transfer (t), the launch (l) and the previous node's (lp), where the rank stood when the
--       step began (anchor), the CPU's own time (dc; pre and post around its last block of bw,
--       which the GPU ended gw after the previous node's end; bsync: that block waited for the GPU's
--       work, a host sync)
--   coll_unseen(rank, comm, name, n_ranks, seen, kernels, wait_ns, ref_ns, excess_ns)   per profiled
--       rank, communicator and kernel name where NCCL counts more members than have a report (seen):
--       the kernels in the rank's window, their wait (each kernel's length less its transfer, the
--       shortest kernel of the same name and message size there: one that waited for nobody; the
--       part of it no compute kernel overlaps), what such a wait is elsewhere (ref: the median over
--       the other profiled ranks of their wait's share of their window in communicators of the same
--       size and kernel, times this rank's window) and the excess above it: the lateness of members
--       without a report (both NULL with no other rank to compare with)
--   replay_scenarios(scn, what, rank, replayed)   scn 0 is the unchanged trace, -1 the stages
--       balanced, -2 the input on time, -3 no host syncs, -4 the ranks not profiled on time;
--       `rank` the rank a what-if changes; replayed: false for a rank that held nobody up (never
--       alone the last to start a node's instance or to end a step), whose what-if saves 0
--   replay_rank_step(scn, step, rank, e_obs, e_rep, forced)   per scenario, step and rank: the
--       end of its last node of the step, measured and replayed; forced: nodes so far that had to
--       be ended without their instance (its members met them in different orders)
--   replay_steps(step, measured_ns, replayed_ns, error_ns, error_pct, forced)   the unchanged
--       replay of each analysed step against the measured one
--   replay_error(steps, measured_ns, error_ns, error_pct, worst_step_pct, forced)   over all
--       analysed steps: the summed absolute error against the summed measured time
--   replay_whatif(scn, what, rank, steps, saving_ns, saving_pct, replayed)   what each what-if saves
--       over the analysed steps, and its share of their measured time (replayed: false where the
--       rank held nobody up, 0)
--   _rp_long(rank, key, x)   each node's own work and CPU times, a row each, keyed by what and
--       where (m, stage, step, pos)
--   _rp_peer(rank, step, pos, w, dc, pre, post, w_med, dc_med, pre_med, post_med)   each node's
--       own work and CPU times, and its stage peers' medians
--   _rp_stage_f(rank, f, fc)   each pipeline rank's factors in the stages-balanced what-if, GPU and CPU
--   _rp_input(rank, step, pos, ns)   each node's GPU idle waiting for input before it
--   _rp_sync(rank, step, pos, ns)   each node's GPU idle after host syncs before it
--   _rp_unseen_k(rank, comm, name, n_ranks, seen, start, end)   each such kernel's wait, from its
--       start until its transfer began
--   _rp_unseen_w(rank, comm, name, n_ranks, seen, start, wait_ns)   each such wait less the part of
--       it compute kernels overlap
--   _rp_unseen(rank, step, pos, ns)   each node's excess wait for ranks not profiled before it
--   _rp_sw(scn, rank, gpos, inst, size, t, dur, buffered, w, dc, pre, post, bw, gw)   the same as
--       each scenario has it, with what a replay round reads of the node (inst numbered; size: its
--       members; bw: the block the CPU waits in, none in `no host syncs` where it was a sync); a
--       rank's what-if holds that rank's nodes only (every other rank's are the unchanged trace's)
--   _rp_run(scn, rank, gpos, e, forced)   each node's replayed end per scenario
--   _rp_steps(scn, step, forced, measured_ns, replayed_ns)   each step per scenario
CREATE OR REPLACE TABLE replay_nodes AS
WITH c AS (  -- collective nodes: the k-th kernel of one name in one communicator group
    SELECT rank, start AS s, "end" AS e, 'c ' || grp || ' ' || name || ' ' || kth AS inst, "end" < latest AS buffered
    FROM coll
), p AS (  -- send/recv nodes: the matched pair, named the same from both sides
    SELECT rank, start AS s, "end" AS e,
           'p ' || CASE WHEN (rank, start) < (peer, peer_start) THEN rank || ':' || start || '-' || peer || ':' || peer_start
                        ELSE peer || ':' || peer_start || '-' || rank || ':' || start END AS inst,
           "end" < peer_start AS buffered
    FROM p2p_match
), n AS (
    SELECT x.*, o.step, o.launch AS l FROM (SELECT * FROM c UNION ALL SELECT * FROM p) x
    JOIN comm_ops o ON o.rank = x.rank AND o.start = x.s AND o.kind = 'kernel' AND o.is_comm
    WHERE o.step IS NOT NULL
), i AS (  -- one step per instance (its members' launches may straddle a step boundary), the
    -- last arrival, and the transfer: the last arriver's kernel, which waited for nobody
    SELECT inst, min(step) AS step, max(s) AS latest, arg_max(e - s, (s, e, rank)) AS t FROM n WHERE NOT buffered
    GROUP BY inst
), m AS (
    SELECT n.rank, coalesce(i.step, n.step) AS step, n.inst, n.s, n.e, n.l, n.buffered,
           coalesce(i.t, n.e - n.s) AS t, n.e - n.s AS dur,
           -- a rank's first node: its own work since its step began
           n.s - coalesce(lag(n.e) OVER (PARTITION BY n.rank ORDER BY n.s, n.inst), least(st.start, n.s)) AS w
    FROM n LEFT JOIN i USING (inst) LEFT JOIN steps st ON st.rank = n.rank AND st.step = coalesce(i.step, n.step)
), a AS (
    SELECT *, first_value(s - coalesce(w, 0)) OVER (PARTITION BY rank, step ORDER BY s, inst) AS anchor,
           lag(l) OVER (PARTITION BY rank ORDER BY s, inst) AS lp
    FROM m
), b AS (  -- per node, where its CPU blocked on the GPU (cpu_blocks) between the previous node's
    -- launch and its own (any thread: the loop thread's sync holds back the autograd thread's
    -- launches too): in all, and its last block, which a sync's GPU work ended at `done`, unless
    -- the GPU waited for a launch after the previous node ended (lb): then that work followed
    -- the CPU, and so does the sync's return
    SELECT a.rank, a.s, a.inst, sum(least(h."end", a.l) - greatest(h.start, a.lp)) AS blocked,
           max(greatest(h.start, a.lp)) AS bs, least(max(h."end"), a.l) AS be,
           arg_max(h.sync, (h."end", h.start)) AS sync,
           CASE WHEN NOT coalesce(arg_max(h.lb, (h."end", h.start)) > a.s - coalesce(a.w, 0), false)
                THEN least(arg_max(h.done, (h."end", h.start)), max(h."end"), a.l) END AS done
    FROM a JOIN cpu_blocks h ON h.rank = a.rank AND h.start < a.l AND h."end" > a.lp
    GROUP BY a.rank, a.s, a.inst, a.l, a.lp, a.w
)
SELECT a.rank, a.step, row_number() OVER (PARTITION BY a.rank, a.step ORDER BY a.s, a.inst) AS pos,
       row_number() OVER (PARTITION BY a.rank ORDER BY a.s, a.inst) AS gpos,
       a.inst, a.s, a.e, coalesce(a.w, 0) AS w, a.t, a.dur, a.buffered, a.l, a.anchor, a.lp,
       -- the CPU's own time: neither blocked nor waiting for room in the launch queue
       a.l - a.lp - coalesce(b.blocked, 0)
           - least(greatest(coalesce(q.cum - qp.cum, 0), 0), a.l - a.lp - coalesce(b.blocked, 0)) AS dc,
       b.bs - a.lp - (b.blocked - (b.be - b.bs)) AS pre, b.be - b.bs AS bw, a.l - b.be AS post,
       CASE WHEN b.sync THEN b.done ELSE b.be END - (a.s - coalesce(a.w, 0)) AS gw, b.sync AS bsync
FROM a LEFT JOIN b USING (rank, s, inst)
LEFT JOIN queue_wait q ON q.rank = a.rank AND q.launch = a.l LEFT JOIN queue_wait qp ON qp.rank = a.rank AND qp.launch = a.lp;

-- Each node's own work and CPU times, one row a value, keyed by what it is and where (the stage,
-- the step, the place in it): what loo_ref compares each rank with its stage's other ranks by.
CREATE OR REPLACE TABLE _rp_long AS
WITH n AS (SELECT n.*, coalesce(r.stage, 0) AS stage FROM replay_nodes n JOIN ranks r USING (rank))
SELECT rank, {'m': m, 'stage': stage, 'step': step, 'pos': pos} AS key, x
FROM (SELECT rank, stage, step, pos, 'w' AS m, w AS x FROM n
      UNION ALL SELECT rank, stage, step, pos, 'dc', dc FROM n
      UNION ALL SELECT rank, stage, step, pos, 'pre', pre FROM n
      UNION ALL SELECT rank, stage, step, pos, 'post', post FROM n)
WHERE x IS NOT NULL;

-- Each node's own work against the median of the stage's other ranks at the same step and place
-- (a rank alone in its stage: its own median over the steps at that place).
CREATE OR REPLACE TABLE _rp_peer AS
WITH peer AS (
    SELECT rank, key.step AS step, key.pos AS pos,
           any_value(ref_med) FILTER (WHERE key.m = 'w') AS w_med, any_value(ref_med) FILTER (WHERE key.m = 'dc') AS dc_med,
           any_value(ref_med) FILTER (WHERE key.m = 'pre') AS pre_med,
           any_value(ref_med) FILTER (WHERE key.m = 'post') AS post_med
    FROM loo_ref('_rp_long') GROUP BY ALL
), own AS (
    SELECT rank, pos, median(w) AS w_med, median(dc) AS dc_med, median(pre) AS pre_med, median(post) AS post_med
    FROM replay_nodes GROUP BY ALL
)
SELECT n.rank, n.step, n.pos, n.w, n.dc, n.pre, n.post, coalesce(p.w_med, o.w_med) AS w_med,
       coalesce(p.dc_med, o.dc_med) AS dc_med, coalesce(p.pre_med, o.pre_med) AS pre_med,
       coalesce(p.post_med, o.post_med) AS post_med
FROM replay_nodes n LEFT JOIN peer p USING (rank, step, pos) LEFT JOIN own o USING (rank, pos);

-- Each rank's factors in the stages-balanced what-if, one for its GPU and one for its CPU: its
-- stage's compute (kernels other than NCCL's in the steps) and CPU time between launches (blocks
-- out; the time around them scaled alike), against the mean over the stages. A stage's compute
-- is its fastest rank's: its ranks run the same kernels, and one whose kernels run slower is a
-- straggler its own what-if costs (one delay counted once). Its CPU time is the mean over its
-- ranks: each rank's loop does more than launch the stage's kernels (its input, its logging), all
-- of it the stage's to carry. Moving
-- layers moves both, but not in one proportion (a stage's launches, input and loss are its own),
-- so each is evened on its own (a pipeline of >= 2 stages whose layout is known, as
-- stage_metrics reads it).
CREATE OR REPLACE TABLE _rp_stage_f AS
WITH c AS (
    SELECT r.rank, r.stage, coalesce(sum(o.compute), 0) AS gpu,
           (SELECT sum(dc) FROM replay_nodes n WHERE n.rank = r.rank) AS cpu
    FROM ranks r LEFT JOIN step_ops o ON o.rank = r.rank AND o.step IS NOT NULL
    WHERE r.stage IS NOT NULL AND r.rank IN (SELECT rank FROM replay_nodes)
      AND (SELECT coalesce(json_extract(value, '$.known')::BOOLEAN, false) FROM meta WHERE key = 'layout')
    GROUP BY ALL
), s AS (SELECT stage, min(gpu) AS gpu, avg(cpu) AS cpu FROM c GROUP BY stage)
SELECT c.rank, (SELECT avg(gpu) FROM s) / s.gpu AS f, (SELECT avg(cpu) FROM s) / s.cpu AS fc
FROM c JOIN s USING (stage)
WHERE (SELECT count(*) FROM s) > 1 AND (SELECT min(gpu) FROM s) > 0 AND (SELECT min(cpu) FROM s) > 0;

-- Each node's GPU idle waiting for input since the previous node ended: the gaps attributed to
-- an input-pipeline range or phase (params.input_re: a data-loading range, the wait between
-- steps for the next batch; never a gap named after the loop thread's call, params.call_gap),
-- what the `input on time` what-if removes.
CREATE OR REPLACE TABLE _rp_input AS
WITH grp AS (  -- the input's range groups: the pattern, a parameter, is compiled once a group, not once a gap
    SELECT range_group FROM (SELECT DISTINCT range_group FROM gap_attr), params p
    WHERE regexp_matches(range_group, p.input_re) AND NOT starts_with(range_group, p.call_gap)
), g AS (SELECT rank, s, e FROM gap_attr SEMI JOIN grp USING (range_group))
SELECT n.rank, n.step, n.pos, sum(least(g.e, n.s) - greatest(g.s, n.s - n.w)) AS ns
FROM replay_nodes n JOIN g ON g.rank = n.rank AND g.s < n.s AND g.e > n.s - n.w
GROUP BY ALL;

-- Each node's GPU idle after host syncs since the previous node ended (sync_idle: from a sync's
-- return until the GPU's next work), what the `no host syncs` what-if removes; not the idle the
-- CPU spent waiting for input or in work between steps (in such a gap at its middle), which is
-- theirs, counted once.
CREATE OR REPLACE TABLE _rp_sync AS
WITH grp AS (  -- the input's range groups and the between-steps work's (a regex compiled once a group)
    SELECT range_group FROM (SELECT DISTINCT range_group FROM gap_attr), params p
    WHERE (regexp_matches(range_group, p.input_re) AND NOT starts_with(range_group, p.call_gap))
       OR range_group = 'between steps (other work)'
), g AS (  -- their gaps (GPU idle gaps: none overlaps another on a rank)
    SELECT rank, s, e FROM gap_attr SEMI JOIN grp USING (range_group)
), i AS (
    SELECT rank, "end" AS s, "end" + idle_ns AS e, "end" + idle_ns // 2 AS mid FROM sync_idle WHERE idle_ns > 0
), y AS (  -- the one gap that can hold a sync's idle's middle: the last to start at or before it
    SELECT i.rank, i.s, i.e FROM i ASOF LEFT JOIN g ON g.rank = i.rank AND g.s <= i.mid
    WHERE g.e IS NULL OR g.e <= i.mid
)
SELECT n.rank, n.step, n.pos, sum(least(y.e, n.s) - greatest(y.s, n.s - n.w)) AS ns
FROM replay_nodes n JOIN y ON y.rank = n.rank AND y.s < n.s AND y.e > n.s - n.w
GROUP BY ALL;

-- Collectives whose communicator has members without a report: their kernels, each one's wait
-- (its length less the transfer, the part no compute kernel overlaps) and its excess over what the
-- other profiled ranks wait in communicators of the same size and kernel.
CREATE OR REPLACE TABLE _rp_unseen_k AS
WITH seen AS (SELECT comm, count(DISTINCT rank) AS n FROM nccl_kernel_comm GROUP BY comm),
k AS (
    SELECT o.rank, o.name, o.start, o."end", kc.comm, s.n_ranks, seen.n AS seen, b.msg_bytes
    FROM comm_ops o JOIN nccl_kernel_comm kc ON kc.rank = o.rank AND kc.start = o.start
    JOIN nccl_comm_size s USING (comm) JOIN seen USING (comm) JOIN win w ON w.rank = o.rank
    LEFT JOIN comm_bytes b ON b.rank = o.rank AND b.start = o.start
    WHERE o.kind = 'kernel' AND o.is_comm AND NOT is_p2p(o.name) AND s.n_ranks > seen.n
      AND o.start >= w.w0 AND o.start < w.w1
)  -- the wait: from the kernel's start until its transfer began
SELECT rank, comm, name, n_ranks, seen, start,
       "end" - min("end" - start) OVER (PARTITION BY rank, comm, name, msg_bytes) AS "end"
FROM k;

CREATE OR REPLACE TABLE _rp_unseen_w AS  -- less the part of it compute kernels overlap
WITH o AS (
    SELECT rank, start, "end", sum(least(d_e, "end") - greatest(d_s, start)) AS ov
    FROM overlapping('compute_islands', '_rp_unseen_k') GROUP BY ALL
)
SELECT k.rank, k.comm, k.name, k.n_ranks, k.seen, k.start, k."end" - k.start - coalesce(o.ov, 0) AS wait_ns
FROM _rp_unseen_k k LEFT JOIN o USING (rank, start, "end");

CREATE OR REPLACE TABLE coll_unseen AS
WITH c AS (
    SELECT k.rank, k.comm, k.name, any_value(k.n_ranks) AS n_ranks, any_value(k.seen) AS seen, count(*) AS kernels,
           sum(k.wait_ns) AS wait_ns, any_value(w.w1 - w.w0) AS win_ns
    FROM _rp_unseen_w k JOIN win w USING (rank) GROUP BY k.rank, k.comm, k.name
), r AS (  -- the other ranks' share of their window (leave-one-out: a rank is never its own reference)
    SELECT a.rank, a.comm, a.name, median(1.0 * b.wait_ns / b.win_ns) AS share
    FROM c a JOIN c b ON b.n_ranks = a.n_ranks AND b.name = a.name AND b.rank <> a.rank
    GROUP BY ALL
)
SELECT c.rank, c.comm, c.name, c.n_ranks, c.seen, c.kernels, c.wait_ns,
       CAST(round(r.share * c.win_ns) AS BIGINT) AS ref_ns,
       CASE WHEN r.share IS NOT NULL THEN greatest(c.wait_ns - CAST(round(r.share * c.win_ns) AS BIGINT), 0) END
           AS excess_ns
FROM c LEFT JOIN r USING (rank, comm, name);

-- Each node's share of that excess since the previous node ended (each kernel's wait scaled by
-- its rank's excess over its wait there), what `ranks not profiled on time` removes.
CREATE OR REPLACE TABLE _rp_unseen AS
WITH f AS (SELECT rank, comm, name, 1.0 * excess_ns / wait_ns AS f FROM coll_unseen WHERE excess_ns > 0)
SELECT n.rank, n.step, n.pos, least(CAST(round(sum(k.wait_ns * f.f)) AS BIGINT), any_value(n.w)) AS ns
FROM replay_nodes n JOIN _rp_unseen_w k ON k.rank = n.rank AND k.start < n.s AND k.start >= n.s - n.w
JOIN f ON f.rank = k.rank AND f.comm = k.comm AND f.name = k.name
GROUP BY ALL;

-- The what-ifs. A rank's own work at its peers' pace can only move its own arrivals earlier (the
-- replay is max-plus): what it saves comes from the synchronisations it arrived at last, and from
-- the steps it ended last. A rank that was never alone the last to start a node's instance nor
-- alone the last to end a step held nobody up (where another rank arrived with it, as the copies
-- of one rank do, removing it leaves the other): its what-if is not replayed and saves 0. The
-- trace's starts, not the replay's arrivals, tell who came last: where the replay orders two
-- arrivals otherwise, replaying it would save what the replay misplaces them by, no more than the
-- replay's error on the real captures (tests/test_replay.py).
CREATE OR REPLACE TABLE replay_scenarios AS
WITH start_last AS (
    SELECT rank FROM replay_nodes
    QUALIFY s = max(s) OVER (PARTITION BY inst) AND count(*) OVER (PARTITION BY inst, s) = 1
), step_end AS (  -- each rank's end of the step: its last node's (replay_rank_step's e_obs)
    SELECT rank, step, arg_max(e, gpos) AS e FROM replay_nodes GROUP BY ALL
), end_last AS (
    SELECT rank FROM step_end QUALIFY e = max(e) OVER (PARTITION BY step) AND count(*) OVER (PARTITION BY step, e) = 1
), held AS (SELECT rank FROM start_last UNION SELECT rank FROM end_last),
cand AS (  -- (those that held someone up first: the 32 are tried on them)
    SELECT rank, sum(greatest(w - w_med, 0) + greatest(coalesce(dc - dc_med, 0), 0)) AS ns,
           rank IN (SELECT rank FROM held) AS held
    FROM _rp_peer GROUP BY rank
)
SELECT 0 AS scn, 'unchanged' AS what, NULL::INTEGER AS rank, true AS replayed
UNION ALL
SELECT -1, 'stages balanced', NULL, true FROM _rp_stage_f HAVING count(*) > 0
UNION ALL
SELECT -2, 'input on time', NULL, true FROM _rp_input HAVING count(*) > 0
UNION ALL
SELECT -3, 'no host syncs', NULL, true FROM replay_nodes WHERE bsync HAVING count(*) > 0
UNION ALL
SELECT -4, 'ranks not profiled on time', NULL, true FROM _rp_unseen HAVING count(*) > 0
UNION ALL
SELECT row_number() OVER (ORDER BY held DESC, ns DESC, rank) AS scn, 'rank ' || rank, rank, held
FROM cand QUALIFY row_number() OVER (ORDER BY held DESC, ns DESC, rank) <= 32;

-- Each scenario's own work per node: the what-if's rank at its peers' median, never slower (and
-- no bound where it had none: a launch without a CUDA call, no block between two launches); the
-- stages balanced; the input on time: the GPU's wait for input out of its own work, and out of
-- the CPU's time before its launch, where the loop thread waited for the batch; no host syncs: the
-- GPU's idle after them out of its own work, and the CPU not blocked in them; the ranks not
-- profiled on time: the excess wait for them out of its own work. One row a node of
-- each scenario, with all a replay round reads of it (the node's instance numbered, its members
-- counted; its block left out where the CPU does not wait in it), so that a round joins one table.
CREATE OR REPLACE TABLE _rp_sw AS
WITH inst AS (SELECT inst, row_number() OVER (ORDER BY inst) AS id, count(*) AS size FROM replay_nodes GROUP BY inst),
-- Each node once with all it reads, joined on its own keys (hash joins); only then one row a
-- scenario: a scenario's condition in a join's ON clause would leave the optimizer a nested loop
-- over every node of every scenario.
node AS (
    SELECT p.*, f.f, f.fc, i.ns AS input_ns, y.ns AS sync_ns, u.ns AS unseen_ns, n.gpos, n.t, n.dur, n.buffered,
           n.bw, n.bsync, n.gw, d.id AS inst, d.size
    FROM _rp_peer p JOIN replay_nodes n USING (rank, step, pos) JOIN inst d ON d.inst = n.inst
    LEFT JOIN _rp_stage_f f ON f.rank = p.rank
    LEFT JOIN _rp_input i ON i.rank = p.rank AND i.step = p.step AND i.pos = p.pos
    LEFT JOIN _rp_sync y ON y.rank = p.rank AND y.step = p.step AND y.pos = p.pos
    LEFT JOIN _rp_unseen u ON u.rank = p.rank AND u.step = p.step AND u.pos = p.pos
)
SELECT sc.scn, p.rank, p.gpos, p.inst, p.size, p.t, p.dur, p.buffered,
       CASE WHEN sc.rank = p.rank AND p.w_med < p.w THEN p.w_med WHEN sc.scn = -1 THEN CAST(round(p.w * p.f) AS BIGINT)
            WHEN sc.scn = -2 THEN p.w - coalesce(p.input_ns, 0) WHEN sc.scn = -3 THEN p.w - coalesce(p.sync_ns, 0)
            WHEN sc.scn = -4 THEN p.w - coalesce(p.unseen_ns, 0) ELSE p.w END AS w,
       CASE WHEN sc.rank = p.rank AND p.dc_med < p.dc THEN p.dc_med WHEN sc.scn = -1 THEN CAST(round(p.dc * p.fc) AS BIGINT)
            WHEN sc.scn = -2 THEN greatest(p.dc - coalesce(p.input_ns, 0), 0) ELSE p.dc END AS dc,
       CASE WHEN sc.rank = p.rank AND p.pre_med < p.pre THEN p.pre_med WHEN sc.scn = -1 THEN CAST(round(p.pre * p.fc) AS BIGINT)
            WHEN sc.scn = -2 THEN greatest(p.pre - coalesce(p.input_ns, 0), 0) ELSE p.pre END AS pre,
       CASE WHEN sc.rank = p.rank AND p.post_med < p.post THEN p.post_med WHEN sc.scn = -1 THEN CAST(round(p.post * p.fc) AS BIGINT)
            WHEN sc.scn = -2 THEN greatest(p.post - greatest(coalesce(p.input_ns, 0) - coalesce(p.pre, 0), 0), 0)
            ELSE p.post END AS post,
       CASE WHEN NOT coalesce(sc.scn = -3 AND p.bsync, false) THEN p.bw END AS bw, p.gw
FROM replay_scenarios sc JOIN node p ON sc.rank IS NULL OR sc.rank = p.rank
WHERE sc.replayed
-- In node order: a replay round's cursors stand at nodes close together in gpos, and its join
-- reads the table faster in that order (docs/benchmarks-code.md).
ORDER BY p.gpos, sc.scn, p.rank;

-- The replay: every (scenario, rank) is a cursor at its next node, through the whole capture (a
-- delay in one step moves the next one's start, as in the job). Each round, a cursor arrives at
-- its node after its own work; a node whose instance has every member arrived (or that was
-- buffered) ends, and its cursor moves on; the others wait. A round in which no cursor of a
-- scenario moves would repeat forever (ranks that meet their instances in different orders):
-- its waiting nodes are then forced to end after their own transfer, and counted.
CREATE OR REPLACE TABLE _rp_run AS
WITH RECURSIVE
-- (nodes: the scenario whose rows of _rp_sw the cursor reads, the unchanged trace's for a rank
-- another rank's what-if leaves as it was)
run(scn, nodes, rank, gpos, clock, cpu, forced) AS (
    SELECT sc.scn, CASE WHEN sc.rank IS NULL OR sc.rank = k.rank THEN sc.scn ELSE 0 END, k.rank, 1, k.anchor,
           NULL::BIGINT, 0
    FROM replay_scenarios sc CROSS JOIN (SELECT rank, min_by(anchor, gpos) AS anchor FROM replay_nodes GROUP BY rank) k
    WHERE sc.replayed
    UNION ALL
    SELECT scn, nodes, rank,
           CASE WHEN done OR NOT moved THEN gpos + 1 ELSE gpos END,
           CASE WHEN buffered THEN arr + dur WHEN done THEN greatest(last_arr + t, arr) WHEN NOT moved THEN arr + t
                ELSE clock END,
           CASE WHEN done OR NOT moved THEN c ELSE cpu END,
           forced + CASE WHEN NOT done AND NOT moved THEN 1 ELSE 0 END
    -- The rounds' windows are ordered frames over (scenario, instance), not PARTITION BY: a
    -- partitioned window's set-up costs several times its work on a round's few rows, and the
    -- replay runs a round a node (docs/benchmarks-code.md).
    FROM (
        SELECT *, bool_or(done) OVER (ORDER BY scn RANGE BETWEEN CURRENT ROW AND CURRENT ROW) AS moved FROM (
            SELECT *, buffered OR here = size AS done FROM (
                SELECT *, count(*) OVER peers AS here, max(arr) OVER peers AS last_arr FROM (
                    SELECT *, greatest(clock + w, c) AS arr FROM (
                        SELECT r.scn, r.nodes, r.rank, r.gpos, r.clock, r.cpu, r.forced, n.inst, n.t, n.dur, n.buffered,
                               n.size,
                               n.w,
                               -- the CPU launches the node after its own work since the previous launch;
                               -- when it blocked on the GPU in between, after its last block returned: when
                               -- the CPU got there, or when the GPU let it go (moved with the previous
                               -- node's end); a rank past its last node has no row and stops
                               CASE WHEN n.bw IS NULL THEN r.cpu + n.dc
                                    WHEN n.gw IS NULL THEN r.cpu + n.pre + n.bw + n.post
                                    ELSE greatest(r.cpu + n.pre, r.clock + n.gw) + n.post END AS c
                        FROM run r JOIN _rp_sw n ON n.scn = r.nodes AND n.rank = r.rank AND n.gpos = r.gpos))
                WINDOW peers AS (ORDER BY scn, inst RANGE BETWEEN CURRENT ROW AND CURRENT ROW))))
)
SELECT scn, rank, gpos - 1 AS gpos, any_value(clock) AS e, max(forced) AS forced  -- a node's end: the clock
FROM run WHERE gpos > 1 GROUP BY ALL;                                                -- once past it

-- Per scenario, step and rank: the rank's last node of the step, as measured and as replayed.
CREATE OR REPLACE TABLE replay_rank_step AS
WITH last AS (SELECT rank, step, max(gpos) AS gpos FROM replay_nodes GROUP BY ALL)
SELECT x.scn, l.step, l.rank, n.e AS e_obs, x.e AS e_rep, x.forced
FROM last l JOIN replay_nodes n USING (rank, gpos) JOIN _rp_run x USING (rank, gpos);

-- Step ends: the last node's end over the ranks; a step lasts from the previous step's end (the
-- first: from where the ranks began) to its own.
CREATE OR REPLACE TABLE _rp_steps AS
WITH e AS (
    SELECT scn, step, max(e_obs) AS e_obs, max(e_rep) AS e_rep, max(forced) AS forced FROM replay_rank_step GROUP BY ALL
), t0 AS (SELECT min(anchor) AS t0 FROM replay_nodes WHERE gpos = 1)
SELECT e.scn, e.step, e.forced,
       e.e_obs - coalesce(lag(e.e_obs) OVER w, t0.t0) AS measured_ns,
       e.e_rep - coalesce(lag(e.e_rep) OVER w, t0.t0) AS replayed_ns
FROM e, t0 WINDOW w AS (PARTITION BY e.scn ORDER BY e.step);

CREATE OR REPLACE VIEW replay_steps AS
SELECT s.step, s.measured_ns, s.replayed_ns, s.replayed_ns - s.measured_ns AS error_ns,
       round(100.0 * abs(s.replayed_ns - s.measured_ns) / nullif(s.measured_ns, 0), 2) AS error_pct, s.forced
FROM _rp_steps s, params p
WHERE s.scn = 0 AND in_selected(s.step, (SELECT min(first_step) FROM first_step), p.step_lo, p.step_hi);

CREATE OR REPLACE VIEW replay_error AS
SELECT count(*) AS steps, sum(measured_ns) AS measured_ns, sum(abs(error_ns)) AS error_ns,
       round(100.0 * sum(abs(error_ns)) / nullif(sum(measured_ns), 0), 2) AS error_pct,
       max(error_pct) AS worst_step_pct, max(forced) AS forced
FROM replay_steps HAVING count(*) > 0;

CREATE OR REPLACE VIEW replay_whatif AS
SELECT x.scn, sc.what, sc.rank, count(*) AS steps, sum(b.replayed_ns - x.replayed_ns) AS saving_ns,
       round(100.0 * sum(b.replayed_ns - x.replayed_ns) / nullif(sum(b.measured_ns), 0), 2) AS saving_pct,
       true AS replayed
FROM _rp_steps x JOIN _rp_steps b ON b.step = x.step AND b.scn = 0 JOIN replay_scenarios sc ON sc.scn = x.scn,
     params p
WHERE x.scn <> 0 AND in_selected(x.step, (SELECT min(first_step) FROM first_step), p.step_lo, p.step_hi)
GROUP BY x.scn, sc.what, sc.rank
UNION ALL  -- a rank that held nobody up, not replayed
SELECT scn, what, rank, (SELECT count(*) FROM replay_steps), 0, 0.0, false FROM replay_scenarios
WHERE NOT replayed AND (SELECT count(*) FROM replay_steps) > 0;
