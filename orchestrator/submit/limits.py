"""The stop timing under the name submitit's pickles of earlier jobs give it: submitit pickles each
job's `StopTiming` by its module's name in the run's submitit/*_submitted.pkl, and the node
unpickles it when the job starts. The definitions are in orchestrator/limits.py, which the node
loads without the spec's models (its signal handlers wait for that import)."""

from orchestrator.limits import StopTiming

__all__ = ["StopTiming"]
