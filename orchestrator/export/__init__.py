"""Exports of the store for other tools: the aligned trace of every rank as Chrome JSON or
Perfetto's protobuf (`orch export-trace`). They read the store and the report's findings (which
ranks to keep past the size limit); the report renderers (orchestrator/report/) read only the
analysis product."""
