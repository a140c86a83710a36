-- What the capture itself cost each rank inside its window, estimated. nsys's own
-- PROFILER_OVERHEAD rows (buffer flushes, instrumentation) are only part of it: every traced
-- CUDA call also pays CUPTI's callback, which shows nowhere in the trace but in the call's
-- duration. On an eager loop that adds 30-45 % to the step time (tests/fixtures/modern), far
-- more than PROFILER_OVERHEAD (none inside those windows). The per-call cost is one constant,
-- fitted by scripts/calibrate_overhead.py on H100 captures with nsys 2025.3.1 and
-- --trace=cuda,nvtx,osrt (docs/capture_overhead.md: the fit and its residuals, about
-- +-4 ms per 10-20 ms eager step). Launches are not a term of their own: in every loop they
-- are about half the calls, so the fit cannot tell them apart. The added CPU time only
-- lengthens the window where the GPU waited on the CPU, so the call term is capped by the
-- launch gaps (sub-threshold GPU idle): a GPU-bound loop hides it. The call term's error is
-- the calibration's too: the root mean square of each CPU-bound loop's residual over its call
-- term, over the fitted loops and the other real loops timed without nsys, one relative standard
-- deviation (0.81 of the term: the fitted loops alone would say half, which the others do not
-- bear out).
-- Reads: win, capture_api, profiler_overhead, small_gaps, loo_ref.
-- Provides:
--   overhead_call_ns()  nsys's cost per traced CUDA call, ns (the calibrated constant)
--   overhead_call_err()  the relative standard error of the call term (the calibration's residuals)
--   capture_overhead(rank, window_ns, profiler_ns, api_calls, launches, launch_gap_ns, est_ns, est_err_ns,
--       share, distorted)  per rank: profiler_ns = PROFILER_OVERHEAD time clipped to the window;
--       api_calls = CUDA calls starting in it (any thread), launches = the kernel and graph
--       launches among them; est_ns = profiler_ns + least(api_calls * overhead_call_ns(),
--       launch_gap_ns); est_err_ns = that call term x overhead_call_err() (the profiler time is
--       measured); share = est_ns / window_ns; distorted: share > 5 %, or above 3x the
--       other ranks' median share (and above 2 %; past 16 ranks the median of all: loo_ref)
CREATE OR REPLACE MACRO overhead_call_ns() AS 7600;
CREATE OR REPLACE MACRO overhead_call_err() AS 0.81::DOUBLE;

CREATE OR REPLACE TABLE capture_overhead AS
WITH prof AS (
    SELECT w.rank, sum(least(p."end", w.w1) - greatest(p.start, w.w0)) AS profiler_ns
    FROM win w JOIN profiler_overhead p ON p.rank = w.rank AND p."end" > w.w0 AND p.start < w.w1
    GROUP BY w.rank
), est AS (
    SELECT w.rank, w.w1 - w.w0 AS window_ns, coalesce(p.profiler_ns, 0) AS profiler_ns,
           coalesce(a.api_calls, 0) AS api_calls, coalesce(a.launches, 0) AS launches,
           coalesce(g.ns, 0) AS launch_gap_ns,
           coalesce(p.profiler_ns, 0)
             + least(coalesce(a.api_calls, 0) * overhead_call_ns(), coalesce(g.ns, 0)) AS est_ns
    FROM win w LEFT JOIN capture_api a USING (rank) LEFT JOIN prof p USING (rank) LEFT JOIN small_gaps g USING (rank)
    WHERE w.w1 > w.w0
), shared AS (
    SELECT *, est_ns / window_ns AS share FROM est
), x AS (SELECT rank, 'share' AS key, share AS x FROM shared),
others AS (SELECT rank, ref_med AS others_share FROM loo_ref('x'))
SELECT s.rank, s.window_ns, s.profiler_ns, s.api_calls, s.launches, s.launch_gap_ns, s.est_ns,
       (s.est_ns - s.profiler_ns) * overhead_call_err() AS est_err_ns, s.share,
       (s.share > 0.05 OR (s.share > 0.02 AND s.share > 3 * coalesce(o.others_share, 1))) AS distorted
FROM shared s LEFT JOIN others o USING (rank);
