-- CUDA API and OS runtime calls across ranks (`cuda_api_sum`, `osrt_sum` per rank) and the
-- thread view of seed 000: which thread launched, which was blocked, per step; each rank's rows
-- (the OS calls across ranks: 98_cpu_call_excess.sql).
-- Map: per rank
-- Reads: cuda_api, osrt, threads, stats_cpu, is_sync_api, union_length, rank_pid, thread_role, is_thread_wait.
-- Provides:
--   is_wait_call(name)  OS calls that block the thread (condition waits, polls, locks, joins, sleeps)
--   api_names(api, raw, name, blocking)  each distinct call name, cleaned and classified
--   api_calls(rank, api, name, tid, start, end, blocking)  calls starting inside stats_cpu; api = cuda|osrt; CUDA names without nsys's `_vNNNN` suffix;
--       blocking = is_sync_api (CUDA) or is_wait_call (OS)
--   api_table(rank INTEGER, api VARCHAR, name VARCHAR, tid BIGINT, thread VARCHAR, role VARCHAR, n BIGINT,
--       total_ns BIGINT, mean_ns DOUBLE, med_ns DOUBLE, min_ns BIGINT, max_ns BIGINT, std_ns DOUBLE, n_steps
--       BIGINT, per_step_ns DOUBLE, pct DOUBLE)  tid NULL: the call over all threads (the nsys row); else per
--       thread; pct = share of the rank's time in that api
--   thread_table(rank INTEGER, tid BIGINT, thread VARCHAR, role VARCHAR, span_ns BIGINT, launch_ns BIGINT,
--       sync_ns BIGINT, wait_ns BIGINT, blocked_ns BIGINT, n_steps BIGINT, top_wait VARCHAR,
--       blocked_per_step_ns DOUBLE, blocked_pct DOUBLE, launch_pct DOUBLE)  per thread with calls: launch_ns
--       = union of non-blocking CUDA calls (launches, async copies), sync_ns = blocking CUDA calls
--       (is_sync_api), wait_ns = blocking OS calls (is_wait_call), blocked_ns = union of both (a sync that
--       polls inside counts once), all clipped to the scope's end; span = the scope (or the thread's own
--       first..last call for the whole capture)
--   _thread_names(rank, tid, thread, role)  thread names of the rank's process
--   _thread_calls(rank, cls, s, e, name, api, blocking)  calls per thread, clipped to the scope
--   _thread_blocked(rank, cls, s, e, name, api, blocking)  the blocking ones
--   _thread_launch(rank, cls, s, e, name, api, blocking)  the non-blocking CUDA ones
CREATE OR REPLACE MACRO is_wait_call(name) AS is_thread_wait(name) OR coalesce(regexp_matches(name,
    '^(p?poll|epoll_p?wait2?|p?select|(clock_)?nanosleep|u?sleep|wait(pid|id|4)?|sched_yield|sigtimedwait|sigwaitinfo)$'),
    false);

-- Names are cleaned and classified once per distinct name (a few dozen), not per call.
CREATE OR REPLACE TABLE api_names AS
SELECT 'cuda' AS api, name AS raw, regexp_replace(name, '_v\d{4}$', '') AS name, is_sync_api(name) AS blocking
FROM (SELECT DISTINCT name FROM cuda_api SEMI JOIN stats_cpu USING (rank))
UNION ALL
SELECT 'osrt', name, name, is_wait_call(name) FROM (SELECT DISTINCT name FROM osrt SEMI JOIN stats_cpu USING (rank));

CREATE OR REPLACE TABLE api_calls AS
SELECT a.rank, 'cuda' AS api, n.name, a.tid, a.start, a."end", coalesce(n.blocking, false) AS blocking
FROM cuda_api a JOIN stats_cpu c USING (rank) LEFT JOIN api_names n ON n.api = 'cuda' AND n.raw = a.name
WHERE a.start >= c.s AND a.start < c.e AND a."end" >= a.start
UNION ALL
SELECT o.rank, 'osrt', o.name, o.tid, o.start, o."end", coalesce(n.blocking, false)
FROM osrt o JOIN stats_cpu c USING (rank) LEFT JOIN api_names n ON n.api = 'osrt' AND n.raw = o.name
WHERE o.start >= c.s AND o.start < c.e AND o."end" >= o.start;

CREATE OR REPLACE TABLE _thread_names AS
SELECT t.rank, t.tid, coalesce(t.name, 'thread ' || t.os_tid) || ' (' || t.os_tid || ')' AS thread,
       thread_role(t.name, t.pid = r.pid AND t.os_tid = t.pid) AS role
FROM (SELECT * FROM threads SEMI JOIN stats_cpu USING (rank)) t JOIN rank_pid r USING (rank)
WHERE (t.rank, t.tid) IN (SELECT DISTINCT rank, tid FROM api_calls);

CREATE OR REPLACE TABLE api_table AS
WITH t AS (
    SELECT rank, api, name, CASE WHEN grouping(tid) = 0 THEN tid END AS tid, count(*) AS n,
           sum("end" - start) AS total_ns, avg("end" - start) AS mean_ns, median("end" - start) AS med_ns,
           min("end" - start) AS min_ns, max("end" - start) AS max_ns,
           coalesce(stddev_samp("end" - start), 0) AS std_ns
    FROM api_calls GROUP BY GROUPING SETS ((rank, api, name), (rank, api, name, tid))
)
SELECT t.rank, t.api, t.name, t.tid, n.thread, n.role, t.n, t.total_ns, t.mean_ns, t.med_ns, t.min_ns, t.max_ns,
       t.std_ns, c.n_steps, t.total_ns / c.n_steps AS per_step_ns,
       100.0 * t.total_ns / sum(CASE WHEN t.tid IS NULL THEN t.total_ns END) OVER (PARTITION BY t.rank, t.api) AS pct
FROM t JOIN stats_cpu c USING (rank) LEFT JOIN _thread_names n ON n.rank = t.rank AND n.tid = t.tid;

CREATE OR REPLACE TABLE _thread_calls AS  -- clipped to the scope: a wait that outlives it counts inside only
SELECT a.rank, a.tid AS cls, a.start AS s, least(a."end", c.e) AS e, a.name, a.api, a.blocking
FROM api_calls a JOIN stats_cpu c USING (rank);

CREATE OR REPLACE VIEW _thread_blocked AS
SELECT * FROM _thread_calls WHERE blocking;
CREATE OR REPLACE VIEW _thread_launch AS
SELECT * FROM _thread_calls WHERE api = 'cuda' AND NOT blocking;

CREATE OR REPLACE TABLE thread_table AS
WITH per AS (
    SELECT rank, cls AS tid, min(s) AS first_s, max(e) AS last_e,
           sum(CASE WHEN api = 'cuda' AND blocking THEN e - s ELSE 0 END) AS sync_ns,
           sum(CASE WHEN api = 'osrt' AND blocking THEN e - s ELSE 0 END) AS wait_ns
    FROM _thread_calls GROUP BY ALL
), b AS (SELECT rank, cls AS tid, ns AS blocked_ns FROM union_length('_thread_blocked')),
   l AS (SELECT rank, cls AS tid, ns AS launch_ns FROM union_length('_thread_launch')),
   top AS (SELECT rank, cls AS tid, arg_max(name, (tot, name)) AS top_wait FROM (
               SELECT rank, cls, name, sum(e - s) AS tot FROM _thread_blocked GROUP BY ALL) GROUP BY ALL),
   t AS (
    SELECT per.rank, per.tid, coalesce(n.thread, 'thread ' || per.tid) AS thread, coalesce(n.role, 'other') AS role,
           CASE WHEN c.s <= -1152921504606846976 THEN per.last_e - per.first_s ELSE c.e - c.s END AS span_ns,
           coalesce(l.launch_ns, 0) AS launch_ns, per.sync_ns, per.wait_ns, coalesce(b.blocked_ns, 0) AS blocked_ns,
           c.n_steps, top.top_wait
    FROM per JOIN stats_cpu c USING (rank) LEFT JOIN _thread_names n USING (rank, tid)
    LEFT JOIN b USING (rank, tid) LEFT JOIN l USING (rank, tid) LEFT JOIN top USING (rank, tid)
)
SELECT *, blocked_ns / n_steps AS blocked_per_step_ns,
       100.0 * blocked_ns / nullif(span_ns, 0) AS blocked_pct, 100.0 * launch_ns / nullif(span_ns, 0) AS launch_pct
FROM t;
