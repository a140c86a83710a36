-- What of each gpu-low-util slice's longer gaps is one-off idle (oneoff_gaps: a step over 3 x its
-- rank's median, such as torch.compile's CUDA-graph recording, or a one-time initialisation such
-- as NCCL creating a communicator): idle that recurs in no other step, which the symptom rule,
-- like the rules that cost idle, leaves out of its cost.
-- Reads: oneoff_gaps, steps, gap_attr, gpu_slices. Provides:
--   slice_oneoff(rank, slice, ns)  per slice: its time in gaps of gap_ns or more (gap_attr) that
--       start in a one-off step, or are an initialisation's, as oneoff_gaps counts them
CREATE OR REPLACE VIEW slice_oneoff AS
WITH st AS (  -- only: an initialisation's gaps are its own group's, a long step's all of its gaps
    SELECT DISTINCT o.rank, s.start AS s, s.start + o.step_ns AS e, CASE WHEN o.init THEN o.range_group END AS only
    FROM oneoff_gaps o JOIN steps s USING (rank, step)
), g AS (
    SELECT a.rank, a.s, a.e FROM gap_attr a JOIN st ON a.rank = st.rank AND a.s >= st.s AND a.s < st.e
    WHERE st.only IS NULL OR a.range_group = st.only
)
SELECT sl.rank, sl.slice, sum(least(g.e, sl.e) - greatest(g.s, sl.s)) AS ns
FROM gpu_slices sl JOIN g ON g.rank = sl.rank AND g.e > sl.s AND g.s < sl.e
GROUP BY ALL;
