"""orch: profile torchrun jobs rank by rank with Nsight Systems, on Slurm or locally.

The package follows the pipeline a profiling run goes through:
spec -> render -> submit -> collect (gather, export, ingest) -> analyze -> report.
"""

__version__ = "0.1.0"
