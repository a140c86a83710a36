"""Typed communication section of the report: bytes, transfer time and bandwidth per
collective kind, message-size bucket, communicator group / p2p pair and scope (intra/inter-node),
with the source of the byte counts and the nominal link rate they are compared with.

Kept apart from model_report.py so the report's other parts evolve independently; `Report.comm` holds
one `CommReport` (None when the capture has no NCCL kernels).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from orchestrator.analyze.model_base import Strict

Scope = Literal["intra", "inter"]

class NominalLink(Strict):
    gpu: str
    link: str = Field(description="the link the rate is for")
    gbps_per_direction: float = Field(description="nominal GB/s per GPU and direction, what busbw is compared with")
    why: str


class CommKindRow(Strict):
    kind: str = Field(description="all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all, send_recv")
    size_bucket: str = Field(description="message size bucket: [size, 2 x size) of nccl-tests' S")
    bucket_bytes: int
    scope: Scope
    instances: int = Field(description="rank-instances (each rank's kernel of one collective counts once)")
    median_bytes: float
    transfer_ms: float = Field(description="sum over rank-instances of kernel time minus waiting")
    median_algbw_gbps: float | None
    median_busbw_gbps: float | None
    p10_busbw_gbps: float | None
    pct_of_nominal: float | None = Field(None, description="median busbw / nominal link rate (intra-node only)")


class CommUnitRow(Strict):
    unit: str = Field(description="`group 0,1,...` (a communicator group) or `p2p a-b` (a send/recv pair)")
    ranks: list[int]
    scope: Scope
    kind: str
    size_bucket: str
    bucket_bytes: int
    instances: int
    median_busbw_gbps: float | None


class CommScopeRow(Strict):
    scope: Scope
    instances: int
    gbytes: float
    transfer_ms_per_rank: float
    wait_ms_per_rank: float
    share_of_window_pct: float = Field(description="transfer time (sum, per rank, mean over ranks) / window")
    median_busbw_gbps: float | None


class CommReport(Strict):
    size_source: Literal["nccl_nvtx_payload", "none"] = Field(
        description="where byte counts came from: NCCL's NVTX payload ('Message size [bytes]'), or none recorded")
    sized_kernels: int
    comm_kernels: int
    hint: str | None = Field(None, description="how to capture sizes, when they are missing")
    nominal: NominalLink | None = None
    by_kind: list[CommKindRow] = Field(default_factory=list)
    by_unit: list[CommUnitRow] = Field(default_factory=list)
    by_scope: list[CommScopeRow] = Field(default_factory=list)

