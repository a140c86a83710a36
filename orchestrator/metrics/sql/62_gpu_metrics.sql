-- GPU metrics (nsys --gpu-metrics-devices) per rank over its window. One process per node
-- samples every GPU of the node (orch's collector rank), so a rank's samples are the
-- collector's rows for that rank's device, on the same host.
-- Reads: rank_device, ranks, win, gpu_metrics, step_stats. Provides:
--   gpu_metric_rank(rank, metric, mean, n, collector, out_of_range)   mean of each sampled metric;
--       samples of a percent metric outside 0..100 are impossible: left out of the mean, counted
--   gpu_util(rank, sm_active_pct, tensor_active_pct, dram_read_pct, dram_write_pct, nvlink_tx_pct, n)
--       per rank, the sampled GPU metrics' means (percent)
--   collector_overhead(collectors, collector_median_ns, others_median_ns)
--       the sampling rank's median step time against the others'
CREATE OR REPLACE TABLE gpu_metric_rank AS
SELECT d.rank, m.metric, avg(m.value) FILTER (WHERE NOT m.metric LIKE '%\%]' ESCAPE '\' OR m.value BETWEEN 0 AND 100)
       AS mean, count(*) AS n, min(c.rank) AS collector,
       count(*) FILTER (WHERE m.metric LIKE '%\%]' ESCAPE '\' AND m.value NOT BETWEEN 0 AND 100) AS out_of_range
FROM rank_device d JOIN ranks r USING (rank) JOIN win w USING (rank)
JOIN ranks c ON c.host IS NOT DISTINCT FROM r.host
JOIN gpu_metrics m ON m.rank = c.rank AND m.gpu = d.device AND m.start >= w.w0 AND m.start < w.w1
GROUP BY d.rank, m.metric;

CREATE OR REPLACE VIEW gpu_util AS
SELECT rank,
       round(max(CASE WHEN metric LIKE 'SMs Active%' OR metric LIKE 'SM Active%' THEN mean END), 2) AS sm_active_pct,
       round(max(CASE WHEN metric LIKE 'Tensor Active%' THEN mean END), 2) AS tensor_active_pct,
       round(max(CASE WHEN metric LIKE 'DRAM Read Bandwidth%' THEN mean END), 2) AS dram_read_pct,
       round(max(CASE WHEN metric LIKE 'DRAM Write Bandwidth%' THEN mean END), 2) AS dram_write_pct,
       round(max(CASE WHEN metric LIKE 'NVLink TX Requests User Data%' THEN mean END), 2) AS nvlink_tx_pct,
       max(n) AS n
FROM gpu_metric_rank GROUP BY rank;

-- The sampling collector's own cost: its median step time against the other ranks' median
-- (sampling GPU metrics adds CPU work on that rank only).
CREATE OR REPLACE VIEW collector_overhead AS
WITH c AS (SELECT DISTINCT collector AS rank FROM gpu_metric_rank),
s AS (SELECT st.rank, st.median_ns, st.rank IN (SELECT rank FROM c) AS is_collector FROM step_stats st)
SELECT (SELECT list(rank ORDER BY rank) FROM c) AS collectors,
       median(median_ns) FILTER (WHERE is_collector) AS collector_median_ns,
       median(median_ns) FILTER (WHERE NOT is_collector) AS others_median_ns
FROM s HAVING count(*) FILTER (WHERE is_collector) > 0 AND count(*) FILTER (WHERE NOT is_collector) > 0;
