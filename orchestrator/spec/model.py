"""The job spec (`job.yaml`) and cluster config (`cluster_configs/*.yaml`) as typed models.

Both are strict (`extra="forbid"`): a misspelt key is an error that names the key, never a
silently ignored option on a 512-GPU job.
"""

from __future__ import annotations

import re
import shlex
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator, model_validator

from orchestrator.layout import Layout

# Job and output names end up in file names and `#SBATCH --job-name`: keep them boring.
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SBATCH_TIME_RE = re.compile(r"^(\d+-)?\d{1,3}(:\d{2}){0,2}$|^\d+$")
# Options that render as `#SBATCH <opt>`: one option, no shell, no newline.
SBATCH_LINE_RE = re.compile(r"^--?[A-Za-z][A-Za-z0-9-]*(=[^\n\r\x00]*)?$")


class Strict(BaseModel):
    """Unknown keys are errors, and so are values of the wrong type: no coercion, so
    `nproc_per_node: true` is not 1 and `exclusive: 1` is not true."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def _no_control(value: str) -> str:
    if any(ord(c) < 32 and c != "\t" for c in value) or "\x7f" in value:
        raise ValueError("must not contain newlines or control characters")
    return value


NSYS_VERSION_RE = re.compile(r"(\d{4})\.(\d+)(\.\d+)*")


def parse_nsys_version(text: str) -> tuple[int, int] | None:
    """Parse "2025.3" / "2022.4.2" -> (year, minor); None when it is not an nsys version. The one
    place a version string is read: flag spellings (GPU metrics, --pytorch) key on it."""
    m = NSYS_VERSION_RE.fullmatch(text)
    return (int(m[1]), int(m[2])) if m else None


class NsysInstall(Strict):
    """Which nsys a cluster has; flag spellings changed across releases."""

    path: str = "nsys"
    version: str = "2025.3"
    # `--gpu-metrics-devices` (2023.4+) vs `--gpu-metrics-device` (older); auto: from version.
    gpu_metrics_flag: Literal["auto", "--gpu-metrics-devices", "--gpu-metrics-device"] = "auto"

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        return _no_control(v)

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        if parse_nsys_version(v) is None:
            raise ValueError("must look like 2025.3 or 2022.4.2")
        return v

    @property
    def release(self) -> tuple[int, int]:
        """(year, minor) of this install, e.g. (2023, 4)."""
        parsed = parse_nsys_version(self.version)
        assert parsed is not None  # validated above
        return parsed

    def metrics_flag(self) -> str:
        if self.gpu_metrics_flag != "auto":
            return self.gpu_metrics_flag
        return "--gpu-metrics-devices" if self.release >= (2023, 4) else "--gpu-metrics-device"


class SlurmOptions(Strict):
    """Allocation options: cluster defaults, overridden field by field by the job."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time: str | None = None
    nodes: int | None = Field(default=None, ge=1, le=65536)
    gpus_per_node: int | None = Field(default=None, ge=0, le=64)
    cpus_per_task: int | None = Field(default=None, ge=1, le=4096)
    mem: str | None = None
    exclusive: bool | None = None
    constraint: str | None = None
    extra_sbatch: list[str] | None = None
    # Shell lines run before the launch on every node (module loads, venv activation).
    # They are trusted shell by design and rendered verbatim.
    setup: list[str] | None = None
    modules: list[str] | None = None
    # Prefix for the per-node launch, e.g. "apptainer exec --nv img.sif" (split on spaces).
    container_exec: str | None = None

    @field_validator("partition", "account", "qos", "constraint", "mem")
    @classmethod
    def _simple(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9_.,:|&\[\]*+-]{1,128}", v):
            raise ValueError("may only use letters, digits and _.,:|&[]*+-")
        return v

    @field_validator("time")
    @classmethod
    def _time(cls, v: str | None) -> str | None:
        if v is not None and not SBATCH_TIME_RE.fullmatch(v):
            raise ValueError("must be a Slurm time such as 30, 01:00:00 or 1-12:00:00")
        return v

    @field_validator("extra_sbatch")
    @classmethod
    def _sbatch(cls, v: list[str] | None) -> list[str] | None:
        for line in v or []:
            if not SBATCH_LINE_RE.fullmatch(line):
                raise ValueError(f"{line!r} is not one sbatch option like --mail-type=END")
        return v

    @field_validator("setup", "modules")
    @classmethod
    def _lines(cls, v: list[str] | None) -> list[str] | None:
        for line in v or []:
            _no_control(line)
        return v

    @field_validator("container_exec")
    @classmethod
    def _container(cls, v: str | None) -> str | None:
        if v is None:
            return None
        try:
            shlex.split(_no_control(v))  # the per-node launch splits it the same way
        except ValueError:
            raise ValueError("has an unbalanced quote; close it or drop the quotes "
                             "(it is split like a shell command line)") from None
        return v


class GpuInfo(Strict):
    model: str | None = None  # e.g. "H100", "A100", "none"
    per_node: int = Field(default=0, ge=0, le=64)


class ClusterConfig(Strict):
    """A site description shared by many jobs (`cluster_configs/NAME.yaml`)."""

    name: str
    executor: Literal["slurm", "local"]
    description: str = ""
    gpu: GpuInfo = GpuInfo()
    nsys: NsysInstall = NsysInstall()
    slurm: SlurmOptions = SlurmOptions()
    env: dict[str, str] = {}
    # Interface names the launcher exports for gloo/NCCL, e.g. "lo" on one machine.
    python: str = "python3"

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_env(v)


def _check_env(v: dict[str, str]) -> dict[str, str]:
    for key, value in v.items():
        if not ENV_KEY_RE.fullmatch(key):
            raise ValueError(f"{key!r} is not a valid environment variable name")
        _no_control(value)
    return v


class Rendezvous(Strict):
    """static: node rank = Slurm node id (ranks map to nodes predictably, so orch knows which
    node writes which report); c10d: torchrun's elastic rendezvous."""

    backend: Literal["static", "c10d"] = "static"
    port: Literal["auto"] | int = "auto"

    @field_validator("port")
    @classmethod
    def _port(cls, v: str | int) -> str | int:
        if isinstance(v, int) and not 1024 <= v <= 65535:
            raise ValueError("must be 'auto' or a port between 1024 and 65535")
        return v


class Launch(Strict):
    script: str | None = None
    module: str | None = None
    args: list[str] = []
    nproc_per_node: int = Field(default=1, ge=1, le=256)
    rdzv: Rendezvous = Rendezvous()
    env: dict[str, str] = {}
    python: str | None = None

    @field_validator("script", "module", "python")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        return None if v is None else _no_control(v)

    @field_validator("args")
    @classmethod
    def _args(cls, v: list[str]) -> list[str]:
        for a in v:
            if "\x00" in a:
                raise ValueError("must not contain NUL bytes")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_env(v)

    @model_validator(mode="after")
    def _one_entry(self) -> Launch:
        if (self.script is None) == (self.module is None):
            raise ValueError("give exactly one of launch.script or launch.module")
        return self


class GpuMetrics(Strict):
    enabled: bool = False
    set: str = "auto"
    frequency: int = Field(default=10000, ge=10, le=200000)

    @field_validator("set")
    @classmethod
    def _set(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", v):
            raise ValueError("must be 'auto' or a metric set name such as gh100")
        return v


TraceApi = Literal[
    "cuda", "nvtx", "osrt", "cublas", "cublas-verbose", "cudnn", "cusparse", "nccl",
    "mpi", "ucx", "oshmem", "openacc", "opengl", "vulkan", "none",
]


class Profile(Strict):
    ranks: str | int | list[int] = "all"
    trace: list[TraceApi] = ["cuda", "nvtx", "osrt"]
    sample: Literal["none", "cpu", "process-tree", "system-wide"] = "none"
    cpuctxsw: Literal["none", "process-tree", "system-wide"] = "none"
    capture_range: Literal["none", "cudaProfilerApi", "nvtx"] = "none"
    capture_range_nvtx: str | None = None  # the NVTX range that opens the capture
    capture_range_end: Literal["stop", "stop-shutdown", "repeat", "none"] | None = None
    delay: float | None = Field(default=None, ge=0, le=86400)
    duration: float | None = Field(default=None, gt=0, le=86400)
    pytorch: Literal["autograd-nvtx", "autograd-shapes-nvtx"] | None = None
    cuda_memory_usage: bool = False
    cuda_graph_trace: Literal["graph", "node"] | None = None
    # Record NCCL message sizes (bytes/bandwidth per collective): NVTX tracing on, so NCCL's own
    # ranges and their payloads ("Message size [bytes]") are captured; nsys >= 2024.
    comm_sizes: bool = False
    # NVTX ranges from inside each rank (templates/orch_loop_marks.py.j2): every optimizer step and
    # every wait for the next batch, with no change to the user's code; the steps and the input
    # stalls come from them where the user's own NVTX marks none.
    loop_marks: bool = True
    # With the loop marks, `orch: forward` around each outermost module call and `orch: backward`
    # around each backward pass: the phase tables split a step. Off by default: global module
    # hooks put every module call on nn.Module's slower path.
    module_marks: bool = False
    # Every this many ms from the first optimizer step, the rank's main thread's Python stack is
    # sampled (the same hook; NVTX domain `orch.py`, the nvtx package needed), so that GPU idle
    # while the loop thread runs Python names the user's function and file:line; 0: off. The timer
    # counts the main thread's own CPU time and signals that thread only (docs/report.md).
    python_sampling_ms: int = Field(default=10, ge=0, le=10000)
    gpu_metrics: GpuMetrics = GpuMetrics()
    extra_args: list[str] = []
    output_dir: str | None = None
    output_name: str | None = None
    # How a capture ends when the job does not (time limit, cancel, a failed rank): the early
    # warning comes `warn_lead_s` before the time limit (Slurm's --signal, and the same locally;
    # unset: 90 s, at most half the limit), and each nsys then has `stop_grace_s` to write its
    # report before it is killed. A report needs that time while the job still runs, so the lead
    # must exceed the grace.
    stop_grace_s: int = Field(default=60, ge=1, le=3600)
    warn_lead_s: int | None = Field(default=None, ge=2, le=86400)
    # A profiled rank whose program finished (its main module returned or raised) but whose
    # process has not ended this many seconds later (a thread it never ends, an atexit handler,
    # the teardown of torch.distributed or of the interpreter that hangs) has its capture stopped
    # and is ended, its stacks dumped first: the job does not wait for its time limit. 0: never.
    exit_grace_s: int = Field(default=120, ge=0, le=86400)
    # Each profiled rank exports its own report to SQLite once nsys wrote it, on its node and in
    # parallel with every other rank, into the run's exports/, where `orch collect` takes it as
    # it is. Bounded by export_timeout_s; skipped while the job is being stopped (collect then
    # exports what is missing).
    export_in_job: bool = True
    export_timeout_s: int = Field(default=900, ge=10, le=86400)
    # Each rank's export is also mapped in the job, next to it: its Parquet parts and per-rank
    # statistics (what `orch collect --parts --map-stats` makes), with orch's own Python (the
    # interpreter `orch submit` runs on, which the nodes must see, as on a shared filesystem).
    # `orch collect` then only reduces. Bounded by export_timeout_s; a rank the job could not
    # map is mapped by collect. Unset: on wherever export_in_job is.
    map_in_job: bool | None = None

    @property
    def maps_in_job(self) -> bool:
        """Whether the job maps its ranks' exports (map_in_job, unset: with export_in_job)."""
        return self.export_in_job if self.map_in_job is None else self.map_in_job

    @field_validator("capture_range_nvtx")
    @classmethod
    def _nvtx(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[^\x00-\x1f@]{1,128}(@[^\x00-\x1f@]{1,128})?", v):
            raise ValueError("must be a range name, optionally RANGE@DOMAIN, without control chars")
        return v

    @field_validator("output_name")
    @classmethod
    def _oname(cls, v: str | None) -> str | None:
        if v is not None and not NAME_RE.fullmatch(v):
            raise ValueError("must be 1-64 of letters, digits, '.', '_', '-' (no '/' or '..')")
        return v

    @field_validator("output_dir")
    @classmethod
    def _odir(cls, v: str | None) -> str | None:
        if v is None:
            return v
        _no_control(v)
        if ".." in v.split("/"):
            raise ValueError("must not contain '..'")
        return v

    @field_validator("extra_args")
    @classmethod
    def _extra(cls, v: list[str]) -> list[str]:
        for a in v:
            _no_control(a)
        return v

    @model_validator(mode="after")
    def _capture(self) -> Profile:
        if self.capture_range == "nvtx" and not self.capture_range_nvtx:
            raise ValueError("capture_range: nvtx needs capture_range_nvtx (the range name)")
        if self.capture_range != "nvtx" and self.capture_range_nvtx:
            raise ValueError("capture_range_nvtx is only used with capture_range: nvtx")
        if self.capture_range == "none" and self.capture_range_end:
            raise ValueError("capture_range_end needs capture_range cudaProfilerApi or nvtx")
        if self.map_in_job and not self.export_in_job:
            raise ValueError("map_in_job maps the export the job makes: set export_in_job: true, "
                             "or map_in_job: false")
        if self.warn_lead_s is not None and self.warn_lead_s <= self.stop_grace_s:
            raise ValueError(f"warn_lead_s ({self.warn_lead_s}) must exceed stop_grace_s ({self.stop_grace_s}): "
                             "the reports are written between the warning and the time limit")
        return self


class JobSpec(Strict):
    name: str
    cluster: str = "local"
    slurm: SlurmOptions = SlurmOptions()
    launch: Launch
    layout: Layout = Layout()
    profile: Profile = Profile()
    run_root: str | None = None  # where `orch submit` creates run directories

    @field_validator("layout", mode="before")
    @classmethod
    def _layout(cls, v: object) -> Layout:
        return Layout.from_spec(v)

    @field_serializer("layout")
    def _dump_layout(self, lay: Layout) -> dict[str, int | None]:
        out = {"tp": lay.tp, "pp": lay.pp, "dp": lay.dp}  # the spec's keys, as written
        if lay.vpp > 1:
            out["vpp"] = lay.vpp
        if lay.microbatches is not None:
            out["microbatches"] = lay.microbatches
        return out

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not NAME_RE.fullmatch(v):
            raise ValueError("must be 1-64 of letters, digits, '.', '_', '-', starting with a letter or digit")
        return v

    @field_validator("cluster")
    @classmethod
    def _cluster(cls, v: str) -> str:
        return _no_control(v)
