"""The metrics: every number of the analysis is one named SQL view or table of `sql/NN_*.sql`,
run over a store. Below collect, whose map runs the per-rank files on one rank, and the
analysis, which runs them across ranks and turns the views into the report.

- `orchestrator/sqlmodules.py` reads each file's header (what it reads and provides, with the
  types of what the map writes: the store reads those too, so the parser sits below both);
  `sqlrun.py` runs the files in dependency order, independent files at once;
- `engine.py` opens the store, sets the session and the `params` table, runs the files and
  reads the views (`Views`);
- `rankpass.py`: the per-rank files run once over the ranks whose map the analysis cannot take.
"""
