"""Shape the communication views (54_comm_bytes.sql, 58_bandwidth.sql) into `CommReport`:
units only (ns -> ms, bytes/ns = GB/s), the nominal link rate for the GPU model, and the hint
that says how to record sizes when the export has none."""

from __future__ import annotations

from orchestrator.analyze.model_comm import CommKindRow, CommReport, CommScopeRow, CommUnitRow, NominalLink
from orchestrator.analyze.units import ms
from orchestrator.metrics.engine import Views

# Nominal NVLink rate per GPU and direction (GB/s), by GPU model. busbw (nccl-tests) is what
# each GPU's link carries in one direction while the other direction carries as much, so it is
# compared with the one-direction rate, not the "bidirectional" marketing number (2x).
NVLINK_GBPS: tuple[tuple[str, str, float], ...] = (
    ("B200", "NVLink 5 (18 links x 50 GB/s)", 900.0),
    ("H200", "NVLink 4 (18 links x 25 GB/s)", 450.0),
    ("H100", "NVLink 4 (18 links x 25 GB/s)", 450.0),
    ("H800", "NVLink 4 (8 links x 25 GB/s)", 200.0),
    ("A100", "NVLink 3 (12 links x 25 GB/s)", 300.0),
    ("A800", "NVLink 3 (8 links x 25 GB/s)", 200.0),
)

SIZE_HINT = {
    "no_nvtx": ("no NCCL NVTX ranges in the capture: profile with NVTX tracing (`-t nvtx`; "
                "`profile.comm_sizes: true` in the job spec adds it) and leave NCCL's NVTX on "
                "(NCCL_NVTX_DISABLE unset); NCCL >= 2.19 attaches the message size to each call"),
    "no_payload": ("NCCL's NVTX ranges are there but their payloads were not exported: re-export the "
                   ".nsys-rep with nsys >= 2024 `nsys export --type sqlite --include-json=true` "
                   "(orch collect passes it when its nsys has it) and collect again"),
}


def nominal_for(gpu_name: str | None) -> NominalLink | None:
    """The NVLink rate for a known SXM GPU model; None for PCIe cards and unknown models."""
    if not gpu_name or "PCIe" in gpu_name or "PCIE" in gpu_name.upper().split():
        return None
    for key, link, gbps in NVLINK_GBPS:
        if key in gpu_name:
            return NominalLink(gpu=gpu_name, link=link, gbps_per_direction=gbps,
                               why="busbw counts what one GPU's link carries in one direction (nccl-tests); "
                                   f"{gbps:g} GB/s per direction ({2 * gbps:g} GB/s both ways) is the "
                                   "SXM NVLink rate; intra-node groups only")
    return None


def bucket_label(b: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f:
            return f"{b / f:g} {unit}"
    return f"{b} B"


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(float(x), nd)


def build_comm(v: Views) -> CommReport | None:
    """The communication section, or None when no NCCL kernel ran."""
    info = v.query("SELECT * FROM comm_size_info")[0]
    if not info["n_comm_kernels"]:
        return None
    hint = None
    if not info["n_sized_kernels"]:
        hint = SIZE_HINT["no_payload" if info["n_calls"] else "no_nvtx"]
    gpus = [r["gpu_name"] for r in v.query("SELECT DISTINCT gpu_name FROM ranks WHERE gpu_name IS NOT NULL")]
    nominal = nominal_for(gpus[0]) if len(gpus) == 1 else None
    rate = nominal.gbps_per_direction if nominal else None
    by_kind = [CommKindRow(
        kind=r["kind"], size_bucket=bucket_label(r["bucket"]), bucket_bytes=r["bucket"], scope=r["scope"],
        instances=r["n"], median_bytes=float(r["median_bytes"]), transfer_ms=ms(r["transfer_ns"]),
        median_algbw_gbps=_r(r["median_algbw_gbps"]), median_busbw_gbps=_r(r["median_busbw_gbps"]),
        p10_busbw_gbps=_r(r["p10_busbw_gbps"]),
        pct_of_nominal=_r(100 * r["median_busbw_gbps"] / rate, 1)
        if rate and r["scope"] == "intra" and r["median_busbw_gbps"] is not None else None,
    ) for r in v.query("SELECT * FROM comm_kind_table ORDER BY kind, bucket, scope")]
    by_unit = [CommUnitRow(
        unit=r["unit"], ranks=[int(x) for x in r["ranks"].split(",")], scope=r["scope"], kind=r["kind"],
        size_bucket=bucket_label(r["bucket"]), bucket_bytes=r["bucket"], instances=r["n"],
        median_busbw_gbps=_r(r["median_busbw_gbps"]),
    ) for r in v.query("SELECT * FROM comm_unit_table ORDER BY unit, kind, bucket")]
    by_scope = [CommScopeRow(
        scope=r["scope"], instances=r["n"], gbytes=round((r["bytes"] or 0) / 1e9, 3),
        transfer_ms_per_rank=ms(r["transfer_ns"]), wait_ms_per_rank=ms(r["wait_ns"]),
        share_of_window_pct=round(r["share_of_window_pct"] or 0.0, 2), median_busbw_gbps=_r(r["median_busbw_gbps"]),
    ) for r in v.query("SELECT * FROM comm_scope_table ORDER BY scope")]
    return CommReport(size_source="nccl_nvtx_payload" if info["n_sized_kernels"] else "none",
                      sized_kernels=info["n_sized_kernels"], comm_kernels=info["n_comm_kernels"], hint=hint,
                      nominal=nominal, by_kind=by_kind, by_unit=by_unit, by_scope=by_scope)
