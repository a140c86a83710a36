-- Inferred iterations: for ranks without step ranges, the trace's own period.
-- Map: per rank (steps_known)
-- Reads: steps, step_source, kernels, graph_execs, cuda_api, cuda_calls, is_sync_api, is_optimizer_kernel.
-- Writes: steps, step_source. Rows of family 5, when no rank had NVTX steps (its own or orch's marks): steps
-- [beat_i, beat_{i+1}) on the beat's launching thread, step = i; step_source (5, beat name).
-- Provides:
--   _beat_occ(rank, src, name, tid, ts, cand)  cand: one integer per (rank, src, name)
--   _beat_candidates(rank, src, name, cand, run, n, n_bursts, bursts, t0, t1, period_ns, rcv,
--       regular)  each candidate's longest run, judged
--   _beat_bursts(rank, src, name, cand, n, ts, tid)  each candidate's occurrences merged in bursts
--   _beat_runs(rank, src, name, cand, run, n, n_bursts, bursts, t0, t1, period_ns, rcv)  its regular stretches
--   beat(rank, src, name, t0, t1, bursts, period_ns, rcv, micro_batches, micro_name)  the chosen beat
-- Method (no NVTX: the loop's own period), per rank that has no step ranges:
--   1. Candidate beats: every kernel short name, timed by the start of its CUDA launch call
--      (cuda_api.correlation_id = kernels.correlation_id), every CUDA graph replayed with
--      graph-level tracing (its cudaGraphLaunch), and every host-sync API name (is_sync_api),
--      timed by the call's start. A candidate needs >= 4 occurrences.
--   2. Bursts: a loop that does a thing k times per iteration (`.item()` once per
--      microbatch) repeats in bursts. Sort the intervals between occurrences; a break is an
--      interval at least burst_ratio = 4 times the next smaller one (intervals under 1 us
--      count as 1 us), with at least 3 intervals above it. The lowest such break is used (the
--      least merging: merging too much would fake a longer period): occurrences closer than it
--      merge into one burst, timed by its first occurrence. No break: each occurrence is a burst.
--   3. Regular run: consecutive burst-to-burst intervals each within 25 % of the one before
--      form a run (start-up, warm-up and tear-down break it off). A candidate's longest run is
--      regular with >= 4 bursts, a robust coefficient of variation (1.4826 * MAD / median)
--      below max_rcv = 0.2, and at least a third of the candidate's bursts (a stretch of a
--      kernel that repeats every layer within one step is not the loop).
--   4. The iteration count is the burst count most regular candidates agree on (ties: the
--      smaller count), among the candidates whose run spans at least a fifth of the longest
--      regular run (a pattern of torch.compile's warm-up, each layer's kernels once in a few
--      ms, is regular but short, and has many more names than the loop's own); the beat is the
--      regular candidate with that count and the lowest robust CV (ties: a host sync first,
--      then by name), a CUDA graph only when no kernel or host sync has that count: a graph is
--      not replayed in the iterations that warm it up and record it, so its bursts start
--      iterations after the loop does, while a kernel launched outside the graphs every
--      iteration (gradient clipping, the optimizer) was there from the first.
--   5. Gradient accumulation: an iteration is an optimizer step. When a regular candidate
--      launched by the optimizer or gradient clipping (is_optimizer_kernel), at least 1.5 x the
--      beat's period, holds the same k >= 2 of the beat's bursts between its own in at least
--      three quarters of its intervals, it becomes the beat and the old beat its micro-batch:
--      micro_batches = k. Counted, not read off the period ratio: the optimizer's own time
--      lengthens its period (4 micro-batches of 15 ms and a 5 ms optimizer: 4.33 periods).
--   6. The beat's run is then extended over its neighbouring bursts while each interval stays
--      within [1/4, 8] x its period: a step that also logs breaks a 25 % run but is no warm-up.
--      The CPU runs ahead of a busy GPU, so a `.item()` every N steps waits for several queued
--      steps at once and the launches after it come fast (a few periods, then a fraction of
--      one); torch.compile's warm-up and graph recording, start-up and tear-down (tens of
--      periods) still end it. So the steps span the whole steady loop, not its longest calm
--      stretch.
--   7. Steps: [burst_i, burst_{i+1}) over the extended run, on the thread that launched burst_i,
--      numbered 0.. in order, family = 5; the interval into the run (the warm-up iteration)
--      is step 0, which the window leaves out like any first step. The run's last burst opens
--      the last step too, to one period later or that thread's last CUDA call, whichever
--      comes first (the loop's last iteration has no next burst to end it).
-- Ranks with NVTX step ranges are left alone. Known limit: when the warm-up repeats a pattern
-- more often than the steady loop does (e.g. a pipeline stage waiting at start), the vote
-- can pick the warm-up's pattern.
-- cand: one integer per (rank, src, name), what every window below partitions by (sorting on
-- the kernel names themselves made each window several times slower).
CREATE OR REPLACE TABLE _beat_occ AS
WITH todo AS (
    SELECT rank FROM cuda_calls WHERE rank NOT IN (SELECT rank FROM steps)
), sync_names AS (  -- the regex once per distinct name, not once per call; none read where every rank has steps
    SELECT name FROM (SELECT DISTINCT name FROM cuda_api SEMI JOIN todo USING (rank)) WHERE is_sync_api(name)
), occ AS (
    SELECT a.rank, 'kernel' AS src, k.short_name AS name, a.tid, a.start AS ts
    FROM kernels k JOIN cuda_api a ON a.rank = k.rank AND a.correlation_id = k.correlation_id
    WHERE k.rank IN (SELECT rank FROM todo) AND k.short_name IS NOT NULL
    UNION ALL
    SELECT a.rank, 'graph', 'CUDA graph ' || g.graph_id, a.tid, a.start
    FROM graph_execs g JOIN cuda_api a ON a.rank = g.rank AND a.correlation_id = g.correlation_id
    WHERE g.rank IN (SELECT rank FROM todo)
    UNION ALL
    SELECT a.rank, 'sync', a.name, a.tid, a.start FROM cuda_api a
    WHERE a.rank IN (SELECT rank FROM todo) AND a.name IN (SELECT name FROM sync_names)
), cands AS (
    SELECT *, row_number() OVER (ORDER BY rank, src, name) AS cand FROM (SELECT DISTINCT rank, src, name FROM occ)
)
SELECT occ.*, cands.cand FROM occ JOIN cands USING (rank, src, name);

-- A burst is known by its first occurrence, a run by its first interval: rows that start one
-- are kept (bursts) or found again by an ASOF join (runs), not numbered by a running sum
-- partitioned by cand, which was most of this file's time (DuckDB's partitioned framed sum:
-- 21 ms of 37 ms for 35 k occurrences).
CREATE OR REPLACE TABLE _beat_bursts AS
WITH occ AS (
    SELECT *, ts - lag(ts) OVER (PARTITION BY cand ORDER BY ts, tid) AS gap,
           count(*) OVER (PARTITION BY cand) AS n
    FROM _beat_occ
), sorted AS (
    SELECT cand, gap,
           row_number() OVER (PARTITION BY cand ORDER BY gap DESC) AS r,
           lead(gap) OVER (PARTITION BY cand ORDER BY gap DESC) AS below
    FROM occ WHERE gap IS NOT NULL AND n >= 4
), brk AS (  -- the natural break between within-burst and between-burst intervals
    SELECT cand, arg_max(below, r) AS merge_le
    FROM sorted
    WHERE r >= 3 AND below IS NOT NULL AND gap >= 4 * greatest(below, 1000)
    GROUP BY ALL
)  -- a burst's first occurrence (the first by (ts, tid)): its time and thread
SELECT o.rank, o.src, o.name, o.cand, o.n, o.ts, o.tid
FROM occ o LEFT JOIN brk b USING (cand)
WHERE o.n >= 4 AND (o.gap IS NULL OR o.gap > coalesce(b.merge_le, 0));

-- A run's size comes from where the next run starts (the intervals are numbered i = 1.. per
-- candidate); only a run that can make its candidate regular (>= 4 bursts, the candidate's
-- most: its longest run is the one judged) gets its median and MAD, holistic aggregates that
-- cost most of this statement over every run. The other runs keep period_ns and rcv NULL;
-- their candidates are not regular either way.
CREATE OR REPLACE TABLE _beat_runs AS
WITH iv AS MATERIALIZED (  -- iv: from this burst to the next
    SELECT * FROM (
        SELECT *, CAST(lead(ts) OVER w - ts AS DOUBLE) AS iv, lag(ts) OVER w AS prev_ts,
               row_number() OVER w AS i, count(*) OVER (PARTITION BY cand) AS n_bursts
        FROM _beat_bursts WINDOW w AS (PARTITION BY cand ORDER BY ts))
    WHERE iv IS NOT NULL
), starts AS (  -- a run: consecutive intervals each within 25 % of the one before
    SELECT rank, src, name, cand, n, n_bursts, ts AS run, i FROM iv
    WHERE prev_ts IS NULL OR abs(iv - (ts - prev_ts)) > 0.25 * greatest(iv, ts - prev_ts)
), sized AS (  -- k: the run's intervals, i .. i + k - 1
    SELECT *, coalesce(lead(i) OVER (PARTITION BY cand ORDER BY i), n_bursts) - i AS k FROM starts
), judged AS (
    SELECT s.cand, s.run, median(v.iv) AS period_ns, 1.4826 * mad(v.iv) / greatest(median(v.iv), 1) AS rcv
    FROM sized s JOIN (SELECT cand, max(k) AS most FROM sized GROUP BY cand) m
        ON m.cand = s.cand AND s.k = m.most AND s.k + 1 >= 4
    JOIN iv v ON v.cand = s.cand AND v.i >= s.i AND v.i < s.i + s.k
    GROUP BY s.cand, s.run
)
SELECT s.rank, s.src, s.name, s.cand, s.run, s.n, s.n_bursts, s.k + 1 AS bursts, s.run AS t0,
       e.ts + e.iv AS t1, j.period_ns, j.rcv
FROM sized s JOIN iv e ON e.cand = s.cand AND e.i = s.i + s.k - 1
LEFT JOIN judged j ON j.cand = s.cand AND j.run = s.run;

-- Each candidate's longest run, then the lowest robust CV, then the first (an aggregate per
-- cand, not a window: a hash group instead of a sort of every run).
CREATE OR REPLACE TABLE _beat_candidates AS
SELECT r.*, r.bursts >= 4 AND r.rcv < 0.2 AND r.bursts >= r.n_bursts / 3.0 AS regular
FROM _beat_runs r JOIN (
    SELECT cand, arg_min(run, (-bursts, rcv, run)) AS run FROM _beat_runs GROUP BY cand) USING (cand, run);

CREATE OR REPLACE TABLE beat AS
WITH long_runs AS (
    SELECT c.* FROM _beat_candidates c
    JOIN (SELECT rank, max(t1 - t0) AS span FROM _beat_candidates WHERE regular GROUP BY rank) m USING (rank)
    WHERE c.regular AND c.t1 - c.t0 >= 0.2 * m.span
), votes AS (
    SELECT rank, bursts, row_number() OVER (PARTITION BY rank ORDER BY count(*) DESC, bursts) AS i
    FROM long_runs GROUP BY rank, bursts
), voted AS (
    SELECT rank, src, name, t0, t1, bursts, period_ns, rcv FROM (
        SELECT c.*, row_number() OVER (PARTITION BY c.rank ORDER BY c.src = 'graph', c.rcv, c.src = 'sync' DESC, c.name) AS j
        FROM long_runs c JOIN votes v ON v.rank = c.rank AND v.bursts = c.bursts AND v.i = 1)
    WHERE j = 1
), opt_cand AS (  -- regular optimizer kernels slower than the beat
    SELECT c.rank, c.src, c.name, c.cand, c.t0, c.t1, c.bursts, c.period_ns, c.rcv, v.src AS v_src, v.name AS micro_name
    FROM _beat_candidates c JOIN voted v USING (rank)
    WHERE c.regular AND c.src = 'kernel' AND is_optimizer_kernel(c.name) AND c.period_ns >= 1.5 * v.period_ns
), opt_iv AS (  -- each interval between two optimizer bursts of its regular run
    SELECT * FROM (
        SELECT o.*, b.ts, lead(b.ts) OVER (PARTITION BY o.cand ORDER BY b.ts) AS nxt
        FROM opt_cand o JOIN _beat_bursts b ON b.cand = o.cand AND b.ts BETWEEN o.t0 AND o.t1)
    WHERE nxt IS NOT NULL
), opt_k AS (  -- the beat's bursts in each interval: k micro-batches per optimizer step
    SELECT i.cand, i.ts, count(vb.ts) AS k
    FROM opt_iv i LEFT JOIN _beat_bursts vb
        ON vb.rank = i.rank AND vb.src = i.v_src AND vb.name = i.micro_name AND vb.ts >= i.ts AND vb.ts < i.nxt
    GROUP BY i.cand, i.ts
), opt_mode AS (  -- the usual count, held by at least three quarters of the intervals
    SELECT cand, any_value(m.k) AS k FROM opt_k JOIN (SELECT cand, mode(k) AS k FROM opt_k GROUP BY cand) m USING (cand)
    GROUP BY cand HAVING any_value(m.k) >= 2 AND count(*) FILTER (WHERE opt_k.k = m.k) >= 0.75 * count(*)
), optimizer AS (  -- an optimizer step every k >= 2 beats: gradient accumulation
    SELECT rank, src, name, t0, t1, bursts, period_ns, rcv, k, micro_name FROM (
        SELECT o.*, m.k, row_number() OVER (PARTITION BY o.rank ORDER BY o.rcv, o.name) AS j
        FROM opt_cand o JOIN opt_mode m USING (cand))
    WHERE j = 1
)
SELECT rank, src, name, t0, t1, bursts, period_ns, rcv, CAST(k AS INTEGER) AS micro_batches, micro_name
FROM optimizer
UNION ALL
SELECT rank, src, name, t0, t1, bursts, period_ns, rcv, 1, NULL FROM voted
WHERE rank NOT IN (SELECT rank FROM optimizer);

-- The beat's bursts inside its extended run, plus the burst just before it: the interval into
-- the run is the warm-up iteration (step 0), which the window leaves out like any first step.
INSERT INTO memory.main.steps BY NAME
WITH ext AS (  -- the beat's bursts and the interval to the next one
    SELECT bb.rank, bb.ts, lead(bb.ts) OVER w - bb.ts AS iv, row_number() OVER w AS i
    FROM _beat_bursts bb JOIN beat b USING (rank, src, name) WINDOW w AS (PARTITION BY bb.rank ORDER BY bb.ts)
), banded AS (  -- intervals within [1/4, 8] x the period; consecutive ones share i - r
    SELECT e.*, e.i - row_number() OVER (PARTITION BY e.rank ORDER BY e.i) AS isl
    FROM ext e JOIN beat b USING (rank) WHERE e.iv BETWEEN 0.25 * b.period_ns AND 8 * b.period_ns
), extended AS (  -- the stretch of such intervals that holds the regular run
    SELECT x.rank, x.x0, x.x1 FROM (
        SELECT rank, isl, min(ts) AS x0, max(ts + iv) AS x1 FROM banded GROUP BY rank, isl) x
    JOIN beat b ON b.rank = x.rank AND b.t0 BETWEEN x.x0 AND x.x1
), lead_in AS (
    SELECT b.rank, coalesce(max(bb.ts), any_value(least(b.t0, x.x0))) AS t_first,
           any_value(greatest(b.t1, coalesce(x.x1, b.t1))) AS t_last
    FROM beat b LEFT JOIN extended x USING (rank)
    LEFT JOIN _beat_bursts bb ON bb.rank = b.rank AND bb.src = b.src AND bb.name = b.name
        AND bb.ts < least(b.t0, coalesce(x.x0, b.t0))
    GROUP BY b.rank
), bounded AS (  -- the last burst's step ends one period later or at its thread's last CUDA call
    SELECT bb.rank, bb.tid, bb.ts AS start, lead(bb.ts) OVER (PARTITION BY bb.rank ORDER BY bb.ts) AS next,
           CAST(bb.ts + b.period_ns AS BIGINT) AS one_period
    FROM _beat_bursts bb JOIN beat b USING (rank, src, name) JOIN lead_in l USING (rank)
    WHERE bb.ts BETWEEN l.t_first AND l.t_last
), last_call AS (
    SELECT a.rank, a.tid, max(a."end") AS t FROM cuda_api a JOIN (SELECT DISTINCT rank, tid FROM bounded) USING (rank, tid)
    GROUP BY a.rank, a.tid
)
SELECT rank, tid, start, "end", CAST(row_number() OVER (PARTITION BY rank ORDER BY start) - 1 AS INTEGER) AS step,
       5 AS family
FROM (
    SELECT b.rank, b.tid, b.start, coalesce(b.next, least(b.one_period, greatest(c.t, b.start + 1))) AS "end"
    FROM bounded b LEFT JOIN last_call c USING (rank, tid));

INSERT INTO memory.main.step_source
SELECT 5, min(name) FROM beat WHERE NOT EXISTS (SELECT 1 FROM memory.main.step_source) HAVING count(*) > 0;
