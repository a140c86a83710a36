-- The fixed part of finishing the store (the ingest inserted straight into the event tables;
-- schema.finalize_sql, generated from the registry in tables.py, deletes their impossible rows).

-- Each rank's rows went in with one INSERT per table, so a rank's rows are contiguous:
-- DuckDB's zone maps on `rank` skip the other ranks. A full (rank, start) sort would cost
-- more than the whole ingest of a large job.
CREATE TABLE ranks_sorted AS SELECT * FROM ranks ORDER BY rank;
DROP TABLE ranks;
ALTER TABLE ranks_sorted RENAME TO ranks;
