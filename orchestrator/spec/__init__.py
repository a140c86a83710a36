"""Job spec and cluster config: parse, validate, resolve."""

from orchestrator.spec.load import ResolvedJob, load_job, resolve

__all__ = ["ResolvedJob", "load_job", "resolve"]
