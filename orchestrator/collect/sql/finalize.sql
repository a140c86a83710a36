-- Turn the staging data (views over the ingest workers' tables, dropped afterwards) into the
-- store's tables.

-- Each rank's rows went in with one INSERT per table, so a rank's rows are contiguous:
-- DuckDB's zone maps on `rank` skip the other ranks. A full (rank, start) sort would cost
-- more than the whole ingest of a large job.
CREATE TABLE nvtx AS SELECT * FROM nvtx_stage;
CREATE TABLE kernels AS SELECT * FROM kernels_stage;
CREATE TABLE memcpy AS SELECT * FROM memcpy_stage;
CREATE TABLE memset AS SELECT * FROM memset_stage;
CREATE TABLE cuda_api AS SELECT * FROM cuda_api_stage;
CREATE TABLE gpu_metrics AS SELECT * FROM gpu_metrics_stage;

CREATE TABLE ranks_sorted AS SELECT * FROM ranks ORDER BY rank;
DROP TABLE ranks;
ALTER TABLE ranks_sorted RENAME TO ranks;
