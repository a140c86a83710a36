-- The fixed part of turning staging data into the store (the event tables are copied by
-- schema.finalize_sql, generated from the registry in tables.py).

-- Each rank's rows went in with one INSERT per table, so a rank's rows are contiguous:
-- DuckDB's zone maps on `rank` skip the other ranks. A full (rank, start) sort would cost
-- more than the whole ingest of a large job.
CREATE TABLE ranks_sorted AS SELECT * FROM ranks ORDER BY rank;
DROP TABLE ranks;
ALTER TABLE ranks_sorted RENAME TO ranks;
