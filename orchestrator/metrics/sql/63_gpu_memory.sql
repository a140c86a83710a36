-- GPU memory in use over time per rank (nsys --cuda-memory-usage=true), and across ranks.
-- Reads: gpu_memory, gpu_info, steps, every_step, first_step, win, params, in_selected. Provides:
--   mem_level(rank, device, t, level, baseline)  bytes in use after every instant with allocations
--       or frees on the rank's GPU: a running sum of allocations minus frees, plus the baseline
--   mem_rank(rank, device, capacity, baseline, start_bytes, peak_bytes, peak_t, end_bytes,
--            capture_peak_bytes, growth_per_step, growth_r2, rising_steps, n_steps, headroom_bytes,
--            steps_to_full, n_alloc, n_free)
--       per rank: the levels, their growth per step, capacity and headroom
--   mem_step(rank, step, i, t, level)  bytes in use at the start of each selected step
--   mem_spread(ranks, peak_rank, max_peak_bytes, min_peak_bytes, spread_bytes, median_peak_bytes)
--       the peaks across ranks: highest, lowest, spread, median
--   mem_peak(rank, peak_bytes, peak_t, step, others)  per rank, the highest level of the whole capture
--       (the step a failed job ended in included: an out-of-memory rank's last allocations are
--       there), the step it was reached in, and every other rank's level (rank, bytes) at that moment
--   mem_curve(rank, b, t, level)        the highest level per time bucket (120 over the capture), for the HTML
--
-- Baseline: nsys records the allocations it sees; memory the process held before the capture
-- began is unknown (frees of it appear without their allocation). The curve starts at the
-- smallest baseline that keeps it non-negative: 0 when every free follows its allocation (a
-- capture from the process start), else the most the capture ever freed beyond what it saw
-- allocated. Levels are therefore a lower bound of what the allocator held; the CUDA context
-- itself (hundreds of MiB) is never in these events.
-- Device memory only: pinned and pageable host allocations (cudaHostAlloc) are not on the GPU;
-- managed memory can live on either side and is left out.
-- Levels are taken per timestamp (all events of one ns summed), so ties need no order.
CREATE OR REPLACE TABLE mem_level AS
WITH dev AS (  -- the rank's GPU: the device its allocations put the most bytes on. Not the device
    -- most events are on: nsys files a process's many tiny static module loads under device 0
    -- whatever GPU it uses, which made every rank but rank 0 read GPU 0's near-empty level.
    SELECT rank, arg_max(device, (b, -device)) AS device FROM (
        SELECT rank, device, sum(bytes) AS b FROM gpu_memory
        WHERE mem_kind IN ('device', 'array') AND op = 'alloc' AND bytes IS NOT NULL GROUP BY rank, device)
    GROUP BY rank
), d AS (
    SELECT m.rank, m.device, m.start AS t,
           sum(CASE WHEN m.op = 'alloc' THEN m.bytes WHEN m.op = 'free' THEN -m.bytes ELSE 0 END) AS delta
    FROM gpu_memory m JOIN dev USING (rank, device)
    WHERE m.mem_kind IN ('device', 'array', 'device static') AND m.bytes IS NOT NULL AND m.start IS NOT NULL
    GROUP BY m.rank, m.device, m.start
), run AS (
    SELECT rank, device, t, sum(delta) OVER (PARTITION BY rank ORDER BY t) AS run FROM d
)
SELECT rank, device, t, run + greatest(0, -min(run) OVER (PARTITION BY rank)) AS level,
       greatest(0, -min(run) OVER (PARTITION BY rank)) AS baseline
FROM run;

CREATE OR REPLACE TABLE mem_step AS
WITH sel AS (
    SELECT s.rank, s.step, s.start AS t,
           CAST(row_number() OVER (PARTITION BY s.rank ORDER BY s.start) - 1 AS INTEGER) AS i
    FROM steps s JOIN first_step f USING (rank), params p
    WHERE in_selected(s.step, f.first_step, p.step_lo, p.step_hi)
      AND s.rank IN (SELECT rank FROM mem_level)
), base AS (
    SELECT rank, any_value(baseline) AS baseline FROM mem_level GROUP BY rank
)
SELECT sel.rank, sel.step, sel.i, sel.t, coalesce(l.level, b.baseline) AS level
FROM sel JOIN base b USING (rank) ASOF LEFT JOIN mem_level l ON l.rank = sel.rank AND l.t <= sel.t;

-- The peak of a job that did not complete runs from the window's start to the end of the rank's
-- capture: the step it failed or was stopped in is cut from the steps (10_steps.sql), but the
-- allocations in it are what filled the GPU (an out-of-memory rank's last ones are there); the
-- growth per step and the level at the window's end stay those of the finished steps.
CREATE OR REPLACE TABLE mem_rank AS
WITH base AS (
    SELECT rank, any_value(device) AS device, any_value(baseline) AS baseline, max(level) AS capture_peak,
           count(*) AS n_t
    FROM mem_level GROUP BY rank
), w AS (
    SELECT b.*, win.w0, win.w1 FROM base b JOIN win USING (rank)
), at_start AS (
    SELECT w.rank, coalesce(l.level, w.baseline) AS level FROM w ASOF LEFT JOIN mem_level l
        ON l.rank = w.rank AND l.t <= w.w0
), at_end AS (
    SELECT w.rank, coalesce(l.level, w.baseline) AS level FROM w ASOF LEFT JOIN mem_level l
        ON l.rank = w.rank AND l.t <= w.w1
), inside AS (
    SELECT l.rank, max(l.level) AS peak, arg_max(l.t, (l.level, -l.t)) AS peak_t
    FROM mem_level l JOIN w USING (rank), params p
    WHERE l.t > w.w0 AND (l.t <= w.w1 OR p.ended_early) GROUP BY l.rank
), slope AS (
    SELECT rank, regr_slope(level, i) AS growth, regr_r2(level, i) AS r2, count(*) AS n_steps
    FROM mem_step GROUP BY rank HAVING count(*) >= 3
), rising AS (
    SELECT rank, count(*) FILTER (WHERE d > 0) AS rising FROM (
        SELECT rank, level - lag(level) OVER (PARTITION BY rank ORDER BY i) AS d FROM mem_step) GROUP BY rank
), ops AS (
    SELECT m.rank, count(*) FILTER (WHERE m.op = 'alloc') AS n_alloc, count(*) FILTER (WHERE m.op = 'free') AS n_free
    FROM gpu_memory m JOIN w USING (rank, device)
    WHERE m.mem_kind IN ('device', 'array', 'device static') AND m.start >= w.w0 AND m.start <= w.w1
    GROUP BY m.rank
), cap AS (
    SELECT rank, device, max(total_memory) AS capacity FROM gpu_info GROUP BY rank, device
)
SELECT w.rank, w.device, cap.capacity, w.baseline, s.level AS start_bytes,
       greatest(s.level, coalesce(i.peak, s.level)) AS peak_bytes,
       CASE WHEN coalesce(i.peak, s.level) > s.level THEN i.peak_t ELSE w.w0 END AS peak_t,
       e.level AS end_bytes, w.capture_peak AS capture_peak_bytes,
       sl.growth AS growth_per_step, sl.r2 AS growth_r2, coalesce(r.rising, 0) AS rising_steps,
       coalesce(sl.n_steps, 0) AS n_steps,
       cap.capacity - greatest(s.level, coalesce(i.peak, s.level)) AS headroom_bytes,
       CASE WHEN sl.growth > 0 AND cap.capacity IS NOT NULL
            THEN greatest(0, (cap.capacity - e.level) / sl.growth) END AS steps_to_full,
       coalesce(o.n_alloc, 0) AS n_alloc, coalesce(o.n_free, 0) AS n_free
FROM w JOIN at_start s USING (rank) JOIN at_end e USING (rank)
LEFT JOIN inside i USING (rank) LEFT JOIN slope sl USING (rank) LEFT JOIN rising r USING (rank)
LEFT JOIN ops o USING (rank) LEFT JOIN cap ON cap.rank = w.rank AND cap.device = w.device;

-- Across ranks: the rank with the highest peak (pipeline stage 0 and uneven shards are the
-- usual outliers) and the spread between the highest and the lowest peak.
CREATE OR REPLACE VIEW mem_spread AS
SELECT count(*) AS ranks, first(rank ORDER BY peak_bytes DESC, rank) AS peak_rank,  -- ties: the lowest rank
       max(peak_bytes) AS max_peak_bytes, min(peak_bytes) AS min_peak_bytes,
       max(peak_bytes) - min(peak_bytes) AS spread_bytes, median(peak_bytes) AS median_peak_bytes
FROM mem_rank HAVING count(*) > 0;

CREATE OR REPLACE TABLE mem_peak AS
WITH p AS (
    SELECT rank, max(level) AS peak_bytes, arg_max(t, (level, -t)) AS peak_t FROM mem_level GROUP BY rank
), at_step AS (
    SELECT p.rank, max(e.step) AS step FROM p JOIN every_step e ON e.rank = p.rank
    WHERE e.start <= p.peak_t AND e."end" >= p.peak_t GROUP BY p.rank
), pairs AS (
    SELECT p.rank, o.rank AS other, p.peak_t FROM p JOIN p o ON o.rank <> p.rank
), at_peak AS (
    SELECT x.rank, x.other, coalesce(l.level, 0) AS level
    FROM pairs x ASOF LEFT JOIN mem_level l ON l.rank = x.other AND l.t <= x.peak_t
)
SELECT p.rank, p.peak_bytes, p.peak_t, a.step,
       coalesce((SELECT list({'rank': o.other, 'bytes': o.level} ORDER BY o.other) FROM at_peak o
                 WHERE o.rank = p.rank), []) AS others
FROM p LEFT JOIN at_step a USING (rank);

CREATE OR REPLACE TABLE mem_curve AS
WITH span AS (
    SELECT min(t) AS t0, greatest(max(t) - min(t), 1) AS len FROM mem_level
), b AS (
    SELECT r.rank, g.b, CAST(span.t0 + g.b * span.len / 120 AS BIGINT) AS t
    FROM (SELECT DISTINCT rank FROM mem_level) r, range(0, 121) g(b), span
), at_b AS (  -- the level on entering the bucket
    SELECT b.rank, b.b, b.t, l.level FROM b ASOF LEFT JOIN mem_level l ON l.rank = b.rank AND l.t <= b.t
), inb AS (  -- the highest level reached inside it
    SELECT l.rank, least(120, CAST(floor((l.t - span.t0) * 120.0 / span.len) AS BIGINT)) AS b, max(l.level) AS level
    FROM mem_level l, span GROUP BY ALL
)
SELECT a.rank, a.b, a.t, greatest(coalesce(a.level, 0), coalesce(i.level, 0)) AS level
FROM at_b a LEFT JOIN inb i USING (rank, b);
