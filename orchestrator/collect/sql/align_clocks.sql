-- Optional clock refinement: the k-th NCCL kernel of one name, within one communicator
-- group (same stage and tp index), ends nearly together on every rank it runs on. The
-- per-rank correction is the median of (group median end - this rank's end); it is stored
-- in ranks.clock_correction_ns and applied to every timestamp of that rank.
CREATE TEMP TABLE corr AS
WITH c AS (
    SELECT k.rank, coalesce(r.stage, 0) AS g1, coalesce(r.tp_index, 0) AS g2, k.short_name, k."end",
           row_number() OVER (PARTITION BY k.rank, k.short_name ORDER BY k.start) AS kth
    FROM kernels k JOIN ranks r USING (rank)
    WHERE k.category = 'comm'
), ref AS (
    SELECT g1, g2, short_name, kth, median("end") AS m
    FROM c GROUP BY ALL HAVING count(*) > 1
)
SELECT c.rank, CAST(round(median(ref.m - c."end")) AS BIGINT) AS ns
FROM c JOIN ref USING (g1, g2, short_name, kth)
GROUP BY c.rank;

UPDATE kernels SET start = start + corr.ns, "end" = "end" + corr.ns FROM corr WHERE kernels.rank = corr.rank;
UPDATE memcpy SET start = start + corr.ns, "end" = "end" + corr.ns FROM corr WHERE memcpy.rank = corr.rank;
UPDATE memset SET start = start + corr.ns, "end" = "end" + corr.ns FROM corr WHERE memset.rank = corr.rank;
UPDATE cuda_api SET start = start + corr.ns, "end" = "end" + corr.ns FROM corr WHERE cuda_api.rank = corr.rank;
UPDATE nvtx SET start = start + corr.ns, "end" = "end" + corr.ns FROM corr WHERE nvtx.rank = corr.rank;
UPDATE gpu_metrics SET start = start + corr.ns FROM corr WHERE gpu_metrics.rank = corr.rank;
UPDATE ranks SET clock_correction_ns = corr.ns FROM corr WHERE ranks.rank = corr.rank;
DROP TABLE corr;
