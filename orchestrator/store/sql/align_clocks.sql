-- Optional clock refinement: the k-th NCCL kernel of one name, within one communicator
-- group (same stage and tp index), ends nearly together on every rank it runs on. The
-- per-rank correction is the median of (group median end - this rank's end); it is stored
-- in ranks.clock_correction_ns and applied to every shifted column of that rank (the
-- UPDATEs are generated from the registry in tables.py by schema.align_clocks_sql).
-- NCCL kernels are recognised by name here, as in the analysis (nothing is classified at ingest).
CREATE TEMP TABLE corr AS
WITH c AS (
    SELECT k.rank, coalesce(r.stage, 0) AS g1, coalesce(r.tp_index, 0) AS g2, k.short_name, k."end",
           row_number() OVER (PARTITION BY k.rank, k.short_name ORDER BY k.start) AS kth
    FROM kernels k JOIN ranks r USING (rank)
    WHERE k.short_name LIKE 'nccl%'
), ref AS (
    SELECT g1, g2, short_name, kth, median("end") AS m
    FROM c GROUP BY ALL HAVING count(*) > 1
)
SELECT c.rank, CAST(round(median(ref.m - c."end")) AS BIGINT) AS ns
FROM c JOIN ref USING (g1, g2, short_name, kth)
GROUP BY c.rank;
