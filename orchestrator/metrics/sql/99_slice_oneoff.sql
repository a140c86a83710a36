-- What of each gpu-low-util slice's longer gaps is one-off idle (oneoff_gaps: a step over 3 x its
-- rank's median, such as torch.compile's CUDA-graph recording, or a one-time initialisation such
-- as NCCL creating a communicator; graph_eager_steps: in a loop that keeps recording CUDA graphs,
-- the steps that warm up or record a new shape's, the cuda_graphs finding's idle): idle that
-- recurs in no other step, or another finding's, which the symptom rule, like the rules that cost
-- idle, leaves out of its cost.
-- Reads: oneoff_gaps, graph_eager_steps, steps, gap_attr, gpu_slices. Provides:
--   graph_eager_gaps(rank, step, range_group, ns)  the GPU's idle (gap_attr, by range) in the steps that
--       warm up or record a new shape's CUDA graphs (graph_eager_steps), but what oneoff_gaps already holds
--       (a one-off step's, an initialisation's): the idle rules leave it to the cuda_graphs finding
--   slice_oneoff(rank, slice, ns)  per slice: its time in gaps of gap_ns or more (gap_attr) that
--       start in a one-off step or in a step that warms up or records graphs, or are an
--       initialisation's, as oneoff_gaps counts them
CREATE OR REPLACE VIEW slice_oneoff AS
WITH st AS (  -- only: an initialisation's gaps are its own group's, a long step's all of its gaps
    SELECT DISTINCT o.rank, s.start AS s, s.start + o.step_ns AS e, CASE WHEN o.init THEN o.range_group END AS only
    FROM oneoff_gaps o JOIN steps s USING (rank, step)
    UNION
    SELECT g.rank, min(s.start), max(s."end"), NULL FROM graph_eager_steps g JOIN steps s USING (rank, step)
    GROUP BY g.rank, g.step
), g AS (  -- (a gap in a step both lists hold, once)
    SELECT DISTINCT a.rank, a.s, a.e FROM gap_attr a JOIN st ON a.rank = st.rank AND a.s >= st.s AND a.s < st.e
    WHERE st.only IS NULL OR a.range_group = st.only
)
SELECT sl.rank, sl.slice, sum(least(g.e, sl.e) - greatest(g.s, sl.s)) AS ns
FROM gpu_slices sl JOIN g ON g.rank = sl.rank AND g.e > sl.s AND g.s < sl.e
GROUP BY ALL;

CREATE OR REPLACE VIEW graph_eager_gaps AS
SELECT a.rank, g.step, a.range_group, sum(a.dur) AS ns
FROM graph_eager_steps g
JOIN (SELECT rank, step, min(start) AS s0, max("end") AS s1 FROM steps GROUP BY rank, step) st USING (rank, step)
JOIN gap_attr a ON a.rank = g.rank AND a.s >= st.s0 AND a.s < st.s1
WHERE NOT EXISTS (SELECT 1 FROM oneoff_gaps o
                  WHERE o.rank = a.rank AND o.step = g.step AND o.range_group = a.range_group)
GROUP BY a.rank, g.step, a.range_group;
