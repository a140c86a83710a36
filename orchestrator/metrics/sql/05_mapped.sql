-- The ranks a map computed with this analysis SQL. What the map derived from the rank's own
-- events alone (its optimizer's launches, its steps, its GPU ops per step, its NCCL kernels) is
-- taken from it; what also depends on the report's options and on the other ranks is taken only
-- where the scopes agree (21_stats_scope.sql, map_ranks). The map's times are on the rank's own
-- clock (its one-rank store has no offset): `off` moves them onto the store's.
-- Reads: map_scope, ranks, params. Provides:
--   map_done(rank, off)  ranks whose map ran this SQL (params.map_sql); off: the rank's clock
--       offset and correction in the store
--   map_none(rank)       every other rank, and -1 (no report's: map_todo in 21_stats_scope.sql says
--       why): the ranks the `-- Map: per rank (map_done)` files map themselves (rankpass.py)
CREATE OR REPLACE TABLE map_done AS
SELECT m.rank, any_value(r.clock_offset_ns + coalesce(r.clock_correction_ns, 0)) AS off
FROM map_scope m JOIN ranks r USING (rank), params p
WHERE split_part(m.sql, ' ', 1) = p.map_sql
GROUP BY m.rank;

CREATE OR REPLACE TABLE map_none AS
SELECT rank FROM ranks ANTI JOIN map_done USING (rank) UNION ALL SELECT -1;
