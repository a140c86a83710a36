"""The map of one rank's report inside the job (profile.map_in_job): export_report.sh runs
`python -m orchestrator.collect.jobmap RUN REPORT [STATUS]` on the rank's node once it exported
the report, with orch's own interpreter, so the rank's Parquet parts and per-rank statistics
exist when the job ends and `orch collect` only reduces (run.py takes the parts route when it
finds them). It is `orch collect --parts --map-stats`'s map (mapper.map_report) on the report as
collect will find it (gather.discover: the same origin path, so the same report id), reading
the export the job just made; only the meta says where it ran (`in_job`).

The job has not ended yet, so the map cannot know how it will; STATUS (how the rank's nsys, its
program, exited) tells what this rank can: a rank that did not exit 0 fails its job (torchrun
ends the others), so the map cuts the step its rank was stopped in, as the job's report will
(summarize.py). A rank that exited 0 is taken to complete; where its job failed after all, the
report computes that rank's statistics from its events.

Prints one line (what was mapped, or why not) and exits 0 when the rank is mapped, 1 when not:
the job never fails for it; collect maps what the job did not.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from orchestrator.collect.gather import discover, exports_dir
from orchestrator.collect.mapper import MapTask, map_report, summary
from orchestrator.runpaths import RunPaths
from orchestrator.store.evidence import JobEvidence


def map_in_job(run: Path, report: Path, status: int = 0) -> tuple[bool, str]:
    """(mapped, what to say) for `report` of the run directory `run`, whose rank exited with
    `status`."""
    found = discover([report])
    if len(found) != 1:
        return False, f"{report.name}: not a report orch reads"
    failed = (JobEvidence(job_id=os.environ.get("SLURM_JOB_ID", ""), executor="in job", state="FAILED").end_only()
              if status != 0 else None)
    task = MapTask(report=found[0], parts=RunPaths(run).parts.resolve(), exports=exports_dir(run).resolve(),
                   summaries=True, in_job=True, job=failed)
    meta = map_report(task)
    error = summary(meta)["error"]
    if error:
        return False, f"{report.name}: {error}"
    stats = (f", statistics not computed ({meta['summary_error']})" if meta.get("summary_error")
             else f", statistics without the step it was stopped in (it exited {status})" if status else "")
    return True, f"{report.name}: {sum(meta['rows'].values())} rows as Parquet parts{stats}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3) or (len(args) == 3 and not args[2].isdigit()):
        print("usage: python -m orchestrator.collect.jobmap RUN_DIR REPORT [EXIT_STATUS]", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        ok, said = map_in_job(Path(args[0]), Path(args[1]), int(args[2]) if len(args) == 3 else 0)
    except Exception as e:  # the job must not fail for it: collect maps the report instead
        ok, said = False, f"{Path(args[1]).name}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    verb = "mapped" if ok else "could not map"
    tail = "" if ok else "; orch collect will map it"
    print(f"orch: {verb} {said} in {time.perf_counter() - t0:.1f} s{tail}", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
