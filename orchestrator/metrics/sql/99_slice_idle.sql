-- What the idle of each nsys gpu-low-util slice is made of: launch gaps (GPU idle between
-- kernels shorter than params.gap_ns, the launch-bound signature, whose saving is launch_bound's)
-- and longer gaps, where the CPU side kept the GPU waiting (gap_attr names their ranges). The
-- symptom rule costs only what no cause claims, so it needs the split.
-- Map: per rank
-- Reads: gpu_slices, busy_gaps, params. Provides:
--   slice_idle(rank INTEGER, slice BIGINT, short_ns BIGINT, long_ns BIGINT)  per slice with idle: its idle in
--       gaps under gap_ns and in gaps of gap_ns or more (the two add up to the slice's idle)
CREATE OR REPLACE TABLE slice_idle AS
SELECT s.rank, s.slice,
       coalesce(sum(least(g.e, s.e) - greatest(g.s, s.s)) FILTER (WHERE g.dur < p.gap_ns), 0) AS short_ns,
       coalesce(sum(least(g.e, s.e) - greatest(g.s, s.s)) FILTER (WHERE g.dur >= p.gap_ns), 0) AS long_ns
FROM gpu_slices s JOIN busy_gaps g ON g.rank = s.rank AND g.e > s.s AND g.s < s.e, params p
GROUP BY s.rank, s.slice;
