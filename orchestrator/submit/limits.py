"""The stop timing's old import path. submitit pickles each job's `StopTiming` by its module's
name in the run's submitit/*_submitted.pkl, and the node unpickles it when the job starts: a job
submitted under this name loads here. The definitions are in orchestrator/spec/limits.py."""

from orchestrator.spec.limits import StopTiming

__all__ = ["StopTiming"]
