"""The store, as collect writes it and the analysis reads it: below both, so that neither imports
the other for it.

- `tables.py`: the registry of the tables read from an export (columns, types, shifted clocks)
  and the store's version; `schema.py`: the DDL and SQL made from it (sql/: finalize, clock
  alignment).
- `map_tables.py`: the per-rank tables a map computes next to each rank's data, declared once.
- `views.py`: event tables as views over the parts; `partpaths.py`: the parts' file names.
- `evidence.py`: how the job ended (`JobEvidence`, meta key `job`) and `loaders.py`: its ranks'
  DataLoader settings, as the store keeps them.
"""
