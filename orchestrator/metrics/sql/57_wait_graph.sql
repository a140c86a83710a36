-- The wait-for graph across ranks: one node per rank and matched collective (waiting for the
-- group's last starter) or matched send/recv (waiting for the peer), with the step of its
-- kernel, how much of its wait is excess, and the node the walk back continues on.
-- Excess: a collective's peers should arrive together, so all its waiting is excess. A
-- send/recv wait is partly the pipeline's own schedule (stage 1 waits for stage 0's first
-- forward every step): its excess is what it waits beyond the least of (the same wait's median
-- over the steps, the same wait of its data-parallel peers in the same stage and step). The
-- peers' baseline keeps a rank that waits every step for a slow peer stage from looking normal;
-- the steps' baseline covers pipelines without data-parallel peers.
-- carried: the lateness the waiting rank still has when the wait ends: its excess, or, when its
-- data-parallel peers ended the same wait earlier, how much later it ended (a rank late for its
-- own reasons that then waits the normal time for its late peer stage is still as late after),
-- counted from where the two stood at the end of the previous step.
-- A node is one rank's part in one instance; it waits when the instance's last starter (or its
-- peer) is another rank. pred: where the walk back goes from a node: from a wait to the rank
-- waited for, at the moment it arrived; from a node that did not wait (that rank was on time or
-- last: every peer is in step with it afterwards) to the same rank's previous node.
-- Reads: coll, coll_last, p2p_match, comm_ops, ranks, is_p2p, is_comm. Provides:
--   wait_nodes(id, step, rank, kind, idx, s, e, waited_for, wait_ns, excess_ns, carried_ns, pred)
--       s = the kernel's start, e = when its wait ended (s when it did not wait); idx = the
--       kernel's place among the rank's kernels of that kind in the step
--   wait_edges(id, step, rank, kind, idx, s, e, waited_for, wait_ns, excess_ns, carried_ns, pred)
--       the nodes that waited: rank waited for waited_for during [s, e]
CREATE OR REPLACE TABLE wait_nodes AS
WITH c AS (  -- every collective instance on every rank, waiting or not, with the group's last
    -- starter (one: coll_last), so one node per rank and instance
    SELECT c.rank, c.start, c.name, c.wait_ns, coalesce(l.rank, c.rank) AS waited_for, 'collective' AS kind
    FROM coll c LEFT JOIN coll_last l USING (grp, name, kth)
), n AS (  -- the step of each: its kernel's (the step its launch happened in)
    SELECT c.*, o.step FROM c
    JOIN comm_ops o ON o.rank = c.rank AND o.start = c.start AND o.name = c.name AND o.kind = 'kernel'
    UNION ALL
    SELECT m.rank, m.start, o.name, m.wait_ns, CASE WHEN m.wait_ns > 0 THEN m.peer ELSE m.rank END, 'p2p', o.step
    FROM p2p_match m
    JOIN comm_ops o ON o.rank = m.rank AND o.start = m.start AND o.kind = 'kernel' AND o.is_comm AND is_p2p(o.name)
), k AS (
    SELECT n.rank, n.start, n.wait_ns, CASE WHEN n.wait_ns > 0 THEN n.waited_for ELSE n.rank END AS waited_for,
           n.kind, n.step, r.stage, r.dp_index, r.tp_index,
           row_number() OVER (PARTITION BY n.rank, n.step, n.kind ORDER BY n.start) AS idx
    FROM n JOIN ranks r USING (rank) WHERE n.step IS NOT NULL
), steps_base AS (  -- the same wait's median over the steps
    SELECT rank, kind, idx, median(wait_ns) AS ns FROM k WHERE kind = 'p2p' GROUP BY ALL
), last AS (  -- where each rank stood at the end of each step: its last node's end
    SELECT rank, step, max(start + wait_ns) AS e FROM k GROUP BY ALL
), pg AS (  -- send/recv nodes of ranks with a stage; y: where the wait ended, counted from where the
    -- rank stood at the end of the previous step (peers that never synchronise drift apart)
    SELECT k.rank, k.step, k.idx, k.stage, k.tp_index, k.wait_ns AS x, k.start + k.wait_ns - coalesce(l.e, 0) AS y
    FROM k LEFT JOIN last l ON l.rank = k.rank AND l.step = k.step - 1
    WHERE k.kind = 'p2p' AND k.stage IS NOT NULL
), p1 AS (  -- the same wait on the data-parallel peers: same stage, tp index, step and place
    SELECT *, min(x) OVER w AS x1, max(y) OVER w AS y1, count(*) OVER w AS n FROM pg
    WINDOW w AS (PARTITION BY step, idx, stage, tp_index)
), p2 AS (  -- the runners-up, so that each rank compares with the OTHERS (linear, not peers squared)
    SELECT *, min(x) FILTER (WHERE x > x1) OVER w AS x2, count(*) FILTER (WHERE x = x1) OVER w AS nx1,
           max(y) FILTER (WHERE y < y1) OVER w AS y2, count(*) FILTER (WHERE y = y1) OVER w AS ny1
    FROM p1 WINDOW w AS (PARTITION BY step, idx, stage, tp_index)
), peer_base AS (  -- the peers' least wait; late: how much later this rank's wait ended than theirs
    SELECT rank, step, idx, CASE WHEN x > x1 OR nx1 > 1 THEN x1 ELSE x2 END AS ns,
           y - CASE WHEN y < y1 OR ny1 > 1 THEN y1 ELSE y2 END AS late_ns
    FROM p2 WHERE n > 1
), e AS (
    SELECT row_number() OVER (ORDER BY k.rank, k.start, k.kind, k.idx) AS id, k.step, k.rank, k.kind, k.idx,
           k.start AS s, k.start + k.wait_ns AS e, k.waited_for, k.wait_ns,
           CASE WHEN k.waited_for = k.rank THEN 0
                WHEN k.kind = 'collective' THEN k.wait_ns
                ELSE greatest(k.wait_ns - least(coalesce(sb.ns, 0), coalesce(pb.ns, sb.ns, 0)), 0) END AS excess_ns,
           CASE WHEN k.waited_for <> k.rank THEN greatest(pb.late_ns, 0) END AS late_ns
    FROM k LEFT JOIN steps_base sb USING (rank, kind, idx)
    LEFT JOIN peer_base pb ON pb.rank = k.rank AND pb.step = k.step AND pb.idx = k.idx AND k.kind = 'p2p'
), nxt AS (  -- where the walk back stands after this node: (rank, time)
    SELECT *, waited_for AS at_rank, CASE WHEN waited_for <> rank THEN e ELSE s END AS at_t FROM e
)
SELECT x.* EXCLUDE (late_ns, at_rank, at_t), greatest(x.excess_ns, coalesce(x.late_ns, 0)) AS carried_ns,
       p.id AS pred
FROM nxt x ASOF LEFT JOIN (SELECT rank, s, id FROM e) p ON p.rank = x.at_rank AND x.at_t > p.s;

CREATE OR REPLACE VIEW wait_edges AS
SELECT * FROM wait_nodes WHERE waited_for <> rank;
