-- Every per-rank metric of the report, one row per analysed rank (ns unless _pct).
-- Reads: win, gpu_time, coll_rank, p2p_rank, step_stats, gpu_util, ranks. Provides:
--   rank_metrics(rank, host, stage, status, w0, w1, window_source, window_ns, compute_ns, comm_ns,
--       overlap_ns, busy_ns, p2p_ns, exposed_comm_ns, comm_overlap_pct, compute_pct,
--       no_compute_pct, gpu_idle_pct, nccl_wait_ns, late_count, p2p_wait_ns, transfer_ns, n_coll,
--       mean_step_ns, median_step_ns, p90_step_ns, sm_active_pct, tensor_active_pct,
--       exposed_wait_ns, exposed_transfer_ns, other_gpu_ns, idle_ns)
--       transfer_ns: NCCL kernel time not spent waiting
--       the window in five parts that add up to it (the report's per-rank bars): compute_ns,
--       exposed_transfer_ns + exposed_wait_ns (= exposed_comm_ns: the waiting first, as far as
--       the rank's waits reach), other_gpu_ns (GPU busy with neither), idle_ns (GPU idle)
CREATE OR REPLACE TABLE rank_metrics AS
SELECT r.rank, r.host, r.stage, r.status, w.w0, w.w1, w.source AS window_source, w.w1 - w.w0 AS window_ns,
       t.compute_ns, t.comm_ns, t.overlap_ns, t.busy_ns, t.p2p_ns,
       t.comm_ns - t.overlap_ns AS exposed_comm_ns,
       CASE WHEN t.comm_ns > 0 THEN round(100.0 * t.overlap_ns / t.comm_ns, 2) ELSE 0.0 END AS comm_overlap_pct,
       CASE WHEN w.w1 > w.w0 THEN round(100.0 * t.compute_ns / (w.w1 - w.w0), 2) ELSE 0.0 END AS compute_pct,
       CASE WHEN w.w1 > w.w0 THEN round(100.0 - 100.0 * t.compute_ns / (w.w1 - w.w0), 2) ELSE 0.0 END
           AS no_compute_pct,
       CASE WHEN w.w1 > w.w0 THEN round(100.0 - round(100.0 * t.busy_ns / (w.w1 - w.w0), 2), 2) ELSE 0.0 END
           AS gpu_idle_pct,
       coalesce(c.nccl_wait_ns, 0) AS nccl_wait_ns, coalesce(c.late_count, 0) AS late_count,
       coalesce(p.p2p_wait_ns, 0) AS p2p_wait_ns,
       greatest(t.comm_ns - coalesce(c.nccl_wait_ns, 0) - coalesce(p.p2p_wait_ns, 0), 0) AS transfer_ns,
       coalesce(c.n_coll, 0) AS n_coll, st.mean_ns AS mean_step_ns, st.median_ns AS median_step_ns,
       st.p90_ns AS p90_step_ns, g.sm_active_pct, g.tensor_active_pct,
       least(t.comm_ns - t.overlap_ns, coalesce(c.nccl_wait_ns, 0) + coalesce(p.p2p_wait_ns, 0)) AS exposed_wait_ns,
       t.comm_ns - t.overlap_ns
           - least(t.comm_ns - t.overlap_ns, coalesce(c.nccl_wait_ns, 0) + coalesce(p.p2p_wait_ns, 0))
           AS exposed_transfer_ns,
       greatest(0, t.busy_ns - t.compute_ns - (t.comm_ns - t.overlap_ns)) AS other_gpu_ns,
       greatest(0, (w.w1 - w.w0) - t.busy_ns) AS idle_ns
FROM ranks r JOIN win w USING (rank) JOIN gpu_time t USING (rank)
LEFT JOIN coll_rank c USING (rank) LEFT JOIN p2p_rank p USING (rank) LEFT JOIN step_stats st USING (rank)
LEFT JOIN gpu_util g USING (rank);
