-- The nsys-stats tables across ranks, part 0: their scope and the cross-rank outlier test,
-- which every stats table (phases, kernels, memory operations, API calls, nsys rules) uses.
-- Its own file so that those tables need not wait for the phase table (sqlrun.py).
-- Reads: ranks (all but missing), steps, first_step, win, params, in_selected, map_scope, map_done, ops_mapped,
-- step_ops.
-- Provides:
--   stats_cpu(rank, s, e, n_steps)   CPU-side scope: the span of the selected steps (NULL n_steps
--       and the window `win` without steps); params.stats_scope = 'capture': everything (what
--       `nsys stats` sums, used to check orch against it)
--   stats_gpu(rank, s, e, n_steps)   GPU-side scope: `win` (or everything)
--   rank_pid(rank, pid)  the rank's process: the one whose thread drives the steps (the pid in
--       ranks can come from a file name), else ranks.pid
--   rank_scope(rank INTEGER, s BIGINT, e BIGINT, n_steps BIGINT, gs BIGINT, ge BIGINT, pid BIGINT, sql
--       VARCHAR)  what a rank's per-rank stats tables depend on besides its events: the CPU scope (s, e,
--       n_steps), the GPU scope (gs, ge), the process (names its main thread) and the SQL that computes them
--       (params.map_sql, and the gap threshold the gaps are attributed with: params.gap_ns); a map writes its
--       own as map_scope, on the rank's own clock (store/map_tables.py)
--   map_ranks(rank, off)  ranks whose map_scope moved by off (the store's clock offset and
--       correction of the rank) is their rank_scope: the stats files take their rows from the map
--   map_todo(rank)  every other rank, and -1: the ranks the analysis maps itself, in its per-rank
--       pass (the files marked `-- Map: per rank`, run over these ranks' rows alone: sqlrun.py).
--       -1 is no report's rank: a table that is a view over the parts opens only the files of
--       the ranks a join's other side holds, and every file when that side is empty; so the rank
--       sets that gate event reads (map_none, ops_todo, steps_todo and this) are never empty, and
--       no join yields a row for -1. A rank whose GPU ops are the map's (ops_mapped) and that has
--       any is in map_ranks: the per-rank files never need its other ops, which gpu_ops lacks;
--       else the analysis stops with an error rather than compute that rank without them
--   is_outlier(x, ref_med, ref_mad)  x above the others by > 3 MAD, > 10 % and > 1 ms

CREATE OR REPLACE TABLE stats_cpu AS
WITH sel AS (
    SELECT s.rank, min(s.start) AS s, max(s."end") AS e, count(*) AS n_steps
    FROM steps s JOIN first_step f USING (rank), params p
    WHERE in_selected(s.step, f.first_step, p.step_lo, p.step_hi) GROUP BY s.rank
)
SELECT r.rank,
       CASE WHEN p.stats_scope = 'capture' THEN -1152921504606846976 ELSE coalesce(sel.s, w.w0) END AS s,
       CASE WHEN p.stats_scope = 'capture' THEN 1152921504606846976 ELSE coalesce(sel.e, w.w1) END AS e,
       CASE WHEN p.stats_scope = 'capture' THEN NULL ELSE sel.n_steps END AS n_steps
FROM ranks r CROSS JOIN params p LEFT JOIN sel USING (rank) LEFT JOIN win w USING (rank)
WHERE r.status <> 'missing' AND (p.stats_scope = 'capture' OR coalesce(sel.s, w.w0) IS NOT NULL);

CREATE OR REPLACE TABLE stats_gpu AS
SELECT c.rank,
       CASE WHEN p.stats_scope = 'capture' THEN c.s ELSE coalesce(w.w0, c.s) END AS s,
       CASE WHEN p.stats_scope = 'capture' THEN c.e ELSE coalesce(w.w1, c.e) END AS e, c.n_steps
FROM stats_cpu c CROSS JOIN params p LEFT JOIN win w USING (rank);

CREATE OR REPLACE TABLE rank_pid AS
SELECT r.rank, coalesce(any_value((s.tid >> 24) & 16777215), any_value(r.pid)) AS pid
FROM ranks r LEFT JOIN steps s USING (rank) GROUP BY r.rank;

CREATE OR REPLACE TABLE rank_scope AS
SELECT c.rank, c.s, c.e, c.n_steps, g.s AS gs, g.e AS ge, p.pid, q.map_sql || ' gap_ns=' || q.gap_ns AS sql
FROM stats_cpu c JOIN stats_gpu g USING (rank) JOIN rank_pid p USING (rank) CROSS JOIN params q;

CREATE OR REPLACE TABLE map_ranks AS
WITH k AS (SELECT m.*, d.off FROM map_scope m JOIN map_done d USING (rank))
SELECT k.rank, k.off
FROM k JOIN rank_scope c USING (rank)
WHERE k.s + k.off = c.s AND k.e + k.off = c.e AND k.gs + k.off = c.gs AND k.ge + k.off = c.ge
  AND k.n_steps IS NOT DISTINCT FROM c.n_steps AND k.pid = c.pid AND k.sql = c.sql;

CREATE OR REPLACE TABLE map_todo AS
SELECT rank FROM ranks ANTI JOIN map_ranks USING (rank) UNION ALL SELECT -1
UNION ALL
SELECT CAST(error('orch: the GPU ops of rank ' || rank || ' were taken from its map, but not its statistics')
            AS INTEGER)
FROM ops_mapped WHERE rank NOT IN (SELECT rank FROM map_ranks) AND rank IN (SELECT rank FROM step_ops);

CREATE OR REPLACE MACRO is_outlier(x, ref_med, ref_mad) AS coalesce(
    x > ref_med + 3 * ref_mad AND x > 1.1 * ref_med AND x - ref_med > 1e6, false);
