-- Turn the unsorted staging data (views over the ingest workers' tables, dropped afterwards)
-- into the store's tables, sorted by (rank, start) so DuckDB's zone maps skip everything
-- outside a per-rank time range.

-- NVTX nesting depth per (rank, thread, domain): a running count of open ranges. At equal
-- timestamps ends come before starts (siblings), and longer ranges open first (parents).
CREATE TABLE nvtx AS
WITH numbered AS (
    SELECT row_number() OVER () AS id, * EXCLUDE (depth) FROM nvtx_stage
), ev AS (
    SELECT id, rank, tid, domain_id, start AS ts, 1 AS kind, "end" AS e FROM numbered
    UNION ALL
    SELECT NULL, rank, tid, domain_id, "end", 0, NULL FROM numbered
), running AS (
    SELECT id, sum(CASE WHEN kind = 1 THEN 1 ELSE -1 END) OVER (
        PARTITION BY rank, tid, domain_id ORDER BY ts, kind, e DESC
        ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) - 1 AS depth
    FROM ev
)
SELECT n.rank, n.start, n."end", n.tid, n.domain_id, n.domain, n.text, CAST(r.depth AS INTEGER) AS depth
FROM numbered n JOIN running r ON r.id = n.id
ORDER BY n.rank, n.start;

CREATE TABLE kernels AS SELECT * FROM kernels_stage ORDER BY rank, start;
CREATE TABLE memcpy AS SELECT * FROM memcpy_stage ORDER BY rank, start;
CREATE TABLE memset AS SELECT * FROM memset_stage ORDER BY rank, start;
CREATE TABLE cuda_api AS SELECT * FROM cuda_api_stage ORDER BY rank, start;
CREATE TABLE gpu_metrics AS SELECT * FROM gpu_metrics_stage ORDER BY rank, start;

CREATE TABLE ranks_sorted AS SELECT * FROM ranks ORDER BY rank;
DROP TABLE ranks;
ALTER TABLE ranks_sorted RENAME TO ranks;
