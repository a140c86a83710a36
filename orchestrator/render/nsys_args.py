"""The `nsys profile` command line for a job: one function, used by every rendered script."""

from __future__ import annotations

from orchestrator.errors import OrchError
from orchestrator.nsys import newer_export_options
from orchestrator.spec.load import ResolvedJob


def _fmt_seconds(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def profile_args(job: ResolvedJob) -> list[str]:
    """Options every profiled rank gets (the output name is added by the wrapper)."""
    p = job.spec.profile
    nsys = job.cluster.nsys
    trace = list(p.trace)
    if p.comm_sizes:
        if nsys.release < (2024, 0):
            raise OrchError(
                f"profile.comm_sizes: nsys {nsys.version} of cluster {job.cluster.name} does not record or "
                "export NCCL's NVTX payloads (message sizes); use nsys >= 2024 or drop comm_sizes"
            )
        trace = [t for t in trace if t != "none"]
        if "nvtx" not in trace:
            trace.append("nvtx")  # NCCL's own ranges carry the message size
    args = [
        f"--trace={','.join(trace)}",
        f"--sample={p.sample}",
        f"--cpuctxsw={p.cpuctxsw}",
    ]
    if p.capture_range != "none":
        args.append(f"--capture-range={p.capture_range}")
        if p.capture_range_nvtx:
            args.append(f"--nvtx-capture={p.capture_range_nvtx}")
        if p.capture_range_end:
            args.append(f"--capture-range-end={p.capture_range_end}")
    if p.delay is not None:
        args.append(f"--delay={_fmt_seconds(p.delay)}")
    if p.duration is not None:
        args.append(f"--duration={_fmt_seconds(p.duration)}")
    if p.pytorch:
        if nsys.release < (2023, 0):
            raise OrchError(
                f"profile.pytorch: nsys {nsys.version} of cluster {job.cluster.name} has no "
                "--pytorch option; use a newer nsys (cluster nsys.version/path) or drop it"
            )
        args.append(f"--pytorch={p.pytorch}")
    if p.cuda_memory_usage:
        args.append("--cuda-memory-usage=true")
    if p.cuda_graph_trace:
        args.append(f"--cuda-graph-trace={p.cuda_graph_trace}")
    # nsys otherwise waits, before it writes the report, for every process the program started
    # that outlived it (a DataLoader worker blocked in a read, a logger the program spawned): the
    # rank's report is then lost to the launcher's kill. The job's own end stops those processes.
    args.append("--wait=primary")
    args.append("--force-overwrite=true")
    args.extend(p.extra_args)
    return args


def metrics_args(job: ResolvedJob) -> list[str]:
    """GPU-metrics options, only for the one collecting rank of each node."""
    if not job.gpu_metrics_set:
        return []
    gm = job.spec.profile.gpu_metrics
    return [
        f"{job.cluster.nsys.metrics_flag()}=all",
        f"--gpu-metrics-set={job.gpu_metrics_set}",
        f"--gpu-metrics-frequency={gm.frequency}",
    ]


def newer_export_args(job: ResolvedJob) -> list[str]:
    """The `nsys export` options of nsys 2024+ that `orch collect` asks for, for the in-job
    export of a cluster whose nsys has them (the export asks again without them if refused)."""
    if job.cluster.nsys.release < (2024, 0):
        return []
    return [a for args in newer_export_options().values() for a in args]
