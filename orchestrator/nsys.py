"""What orch knows of the `nsys export` command line, for collect's exports and the job's own (the
rendered in-job export): the newer options it asks for, and how nsys says it rejects one."""

from __future__ import annotations

from orchestrator.store.tables import export_tables

# How nsys says it does not know an option (a POSIX ERE: the in-job export's grep uses it too).
UNKNOWN_OPTION_ERE = r"(unrecogni[sz]ed|unknown|invalid) option"


def newer_export_options() -> dict[str, list[str]]:
    """Options of nsys 2024+, by name. `--include-json`: without it NVTX extended payloads,
    such as NCCL's message sizes (the report's bytes and bandwidth per collective), are left
    out. `--tables`: only the tables orch reads, less to write (docs/benchmarks-code.md)."""
    return {"--include-json": ["--include-json=true"], "--tables": ["--tables", ",".join(export_tables())]}
