"""Load a job spec, resolve its cluster config, and turn both into one `ResolvedJob`.

Everything downstream (render, submit, collect, analyze) reads the `ResolvedJob`, never the
raw YAML, so each derived fact (world size, profiled ranks, GPU-metrics set) has one home.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from orchestrator.errors import OrchError
from orchestrator.layout import Layout
from orchestrator.spec.model import ClusterConfig, JobSpec, SlurmOptions
from orchestrator.spec.ranks import collector_ranks, select_ranks

# GPU model -> nsys GPU-metrics set. Order matters: first substring match wins.
GPU_METRIC_SETS: list[tuple[tuple[str, ...], str]] = [
    (("GH200", "H100", "H200", "H800", "H20"), "gh100"),
    (("A100", "A800"), "ga100"),
    (("A10", "A30", "A40", "A16", "A2", "RTX 30", "RTX A"), "ga10x"),
    (("L40", "L4", "RTX 40", "RTX 6000 ADA", "ADA"), "ad10x"),
    (("T4", "RTX 20", "TITAN RTX", "QUADRO RTX"), "tu10x"),
]


def metric_set_for_gpu(model: str | None) -> str | None:
    if not model:
        return None
    up = model.upper()
    for needles, metric_set in GPU_METRIC_SETS:
        if any(n in up for n in needles):
            return metric_set
    return None


MAX_WORLD = 1 << 18  # far above today's largest jobs; keeps rank lists and manifests bounded


@dataclass(frozen=True)
class ResolvedJob:
    """A validated job with every derived value computed once."""

    spec: JobSpec
    cluster: ClusterConfig
    slurm: SlurmOptions  # cluster defaults overlaid with the job's overrides
    spec_path: Path | None
    nodes: int
    nproc_per_node: int
    gpus_per_node: int
    layout: Layout  # resolved: dp filled from the world size
    profiled_ranks: list[int]
    collector_ranks: list[int]
    gpu_metrics_set: str | None
    program: list[str]  # what torchrun starts for every rank (after the nsys wrapper)
    env: dict[str, str] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def pp(self) -> int:
        return self.layout.pp

    @property
    def dp(self) -> int:
        assert self.layout.dp is not None  # resolve() always fills it
        return self.layout.dp

    @property
    def stage_size(self) -> int:
        return self.tp * self.dp

    @property
    def output_name(self) -> str:
        return self.spec.profile.output_name or self.spec.name


def format_validation_error(err: ValidationError, source: str) -> str:
    """First pydantic error as one line: which field, what is wrong, how to fix it."""
    e = err.errors()[0]
    loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
    kind = e["type"]
    if kind == "extra_forbidden":
        return f"{source}: unknown key '{loc}'; remove it or fix its spelling (see docs/spec.md)"
    if kind == "missing":
        return f"{source}: '{loc}' is required; add it (see docs/spec.md)"
    msg = e["msg"].removeprefix("Value error, ")
    got = e.get("input")
    if isinstance(got, bool) and kind in ("int_type", "float_type", "string_type", "literal_error"):
        msg = f"{msg}; true/false is not a number or a name here"
    shown = repr(got) if not isinstance(got, (dict, list)) else type(got).__name__
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return f"{source}: {loc}: {msg} (got {shown}); fix this value"


class _NoAliasLoader(yaml.SafeLoader):
    """SafeLoader without YAML aliases: `*ref` expansions ("billion laughs") could make a
    tiny file validate for minutes. Job specs never need them."""

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        if self.check_event(yaml.AliasEvent):
            raise _AliasError
        return super().compose_node(parent, index)


    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        # PyYAML keeps the last of two equal keys; a spec that says `nodes` twice is a mistake.
        seen: set[object] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if isinstance(key, (str, int, float, bool)) or key is None:
                if key in seen:
                    raise _DuplicateKeyError(key, key_node.start_mark.line + 1)
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


class _AliasError(Exception):
    pass


class _DuplicateKeyError(Exception):
    def __init__(self, key: object, line: int) -> None:
        super().__init__(key, line)
        self.key, self.line = key, line


MAX_SPEC_BYTES = 1 << 20


def read_yaml(path: Path, what: str) -> dict[str, Any]:
    """A spec file's mapping, every way it can be wrong said in one line (`orch sweep` reads
    the job spec raw too, to set its keys before validating)."""
    try:
        if path.stat().st_size > MAX_SPEC_BYTES:
            raise OrchError(f"{what} {path} is larger than 1 MiB; a spec is a few lines")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise OrchError(f"{what} {path} does not exist; check the path") from None
    except (OSError, UnicodeDecodeError) as e:
        raise OrchError(f"{what} {path} cannot be read ({e.__class__.__name__}); check the file") from None
    try:
        data = yaml.load(text, Loader=_NoAliasLoader)  # a SafeLoader subclass
    except _AliasError:
        raise OrchError(f"{what} {path} uses YAML aliases (*name); write the values out") from None
    except _DuplicateKeyError as e:
        key = repr(e.key)[:60]
        raise OrchError(f"{what} {path}: line {e.line}: key {key} appears twice in one mapping; "
                        "keep one (YAML would silently use the last)") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise OrchError(f"{what} {path}:{where} is not valid YAML; fix the syntax") from None
    except RecursionError:
        raise OrchError(f"{what} {path} is nested too deeply; flatten it") from None
    if not isinstance(data, dict):
        raise OrchError(f"{what} {path} must be a YAML mapping of keys to values")
    return data


def _is_file(p: Path) -> bool:
    """Path.is_file that treats unusable names (too long, NUL) as absent instead of raising."""
    try:
        return p.is_file()
    except (OSError, ValueError):
        return False


def packaged_cluster_dir() -> Path:
    return Path(str(resources.files("orchestrator.cluster_configs")))


def find_cluster(ref: str, spec_dir: Path | None) -> Path:
    """A cluster is a path (has '/' or ends in .yaml) or a name looked up in
    $ORCH_CLUSTER_DIR, ./cluster_configs next to the job file, then orch's shipped configs."""
    if "/" in ref or ref.endswith((".yaml", ".yml")):
        p = Path(ref).expanduser()
        if not p.is_absolute() and spec_dir is not None and _is_file(spec_dir / p):
            p = spec_dir / p
        if not _is_file(p):
            raise OrchError(f"cluster: file {ref} does not exist; give a path or a name from cluster_configs/")
        return p
    dirs = []
    if os.environ.get("ORCH_CLUSTER_DIR"):
        dirs.append(Path(os.environ["ORCH_CLUSTER_DIR"]))
    if spec_dir is not None:
        dirs.append(spec_dir / "cluster_configs")
    dirs.append(packaged_cluster_dir())
    for d in dirs:
        for ext in (".yaml", ".yml"):
            if _is_file(d / f"{ref}{ext}"):
                return d / f"{ref}{ext}"
    known = sorted(p.stem for p in packaged_cluster_dir().glob("*.yaml"))
    raise OrchError(f"cluster: no cluster config named {ref!r}; use one of {', '.join(known)} or a path")


def load_cluster(path: Path) -> ClusterConfig:
    data = read_yaml(path, "cluster config")
    try:
        return ClusterConfig.model_validate(data)
    except ValidationError as e:
        raise OrchError(format_validation_error(e, str(path))) from None


def _merge_slurm(base: SlurmOptions, over: SlurmOptions) -> SlurmOptions:
    merged = base.model_dump()
    merged.update({k: v for k, v in over.model_dump().items() if v is not None})
    return SlurmOptions.model_validate(merged)


def _program(spec: JobSpec, python: str, spec_dir: Path | None) -> list[str]:
    launch = spec.launch
    if launch.module is not None:
        return [python, "-u", "-m", launch.module, *launch.args]
    script = Path(launch.script or "").expanduser()
    if not script.is_absolute():
        base = spec_dir if spec_dir is not None else Path.cwd()
        script = (base / script).resolve()
        if not _is_file(script):
            raise OrchError(
                f"launch.script: {launch.script} not found next to the job file ({base}); "
                "fix the path (relative paths are resolved against the job file's directory)"
            )
    return [python, "-u", str(script), *launch.args]


def resolve(spec: JobSpec, spec_path: Path | None = None) -> ResolvedJob:
    spec_dir = spec_path.parent.resolve() if spec_path is not None else None
    cluster = load_cluster(find_cluster(spec.cluster, spec_dir))
    slurm = _merge_slurm(cluster.slurm, spec.slurm)
    nodes = slurm.nodes or 1
    if cluster.executor == "local" and nodes != 1:
        raise OrchError(
            f"slurm.nodes: the local executor runs on this machine only (got {nodes}); "
            "set nodes: 1 or use a Slurm cluster config"
        )
    nproc = spec.launch.nproc_per_node
    if nodes * nproc > MAX_WORLD:
        raise OrchError(f"world size {nodes * nproc} (slurm.nodes x launch.nproc_per_node) is above "
                        f"{MAX_WORLD}; lower nodes or nproc_per_node")
    gpus = slurm.gpus_per_node if slurm.gpus_per_node is not None else cluster.gpu.per_node
    world = nodes * nproc
    lay = spec.layout.resolve(world, exact=True, nproc_per_node=nproc)
    if not lay.known:  # no layout given: one stage, data parallel over the world
        lay = lay.model_copy(update={"dp": world // (lay.tp * lay.pp), "world_size": world})
    profiled = select_ranks(
        spec.profile.ranks, world=world, nproc_per_node=nproc,
        stage_size=lay.stage_size if lay.known else None,
    )
    gm = spec.profile.gpu_metrics
    metric_set = None
    if gm.enabled:
        metric_set = metric_set_for_gpu(cluster.gpu.model) if gm.set == "auto" else gm.set
        if metric_set is None:
            raise OrchError(
                f"profile.gpu_metrics.set: no known metric set for GPU {cluster.gpu.model!r} "
                f"of cluster {cluster.name}; name one explicitly (see `nsys profile "
                "--gpu-metrics-set=help`) or turn gpu_metrics off"
            )
    env = {**cluster.env, **spec.launch.env}
    python = spec.launch.python or cluster.python
    return ResolvedJob(
        spec=spec, cluster=cluster, slurm=slurm, spec_path=spec_path,
        nodes=nodes, nproc_per_node=nproc, gpus_per_node=gpus or 0,
        layout=lay,
        profiled_ranks=profiled,
        collector_ranks=collector_ranks(profiled, nproc) if metric_set else [],
        gpu_metrics_set=metric_set,
        program=_program(spec, python, spec_dir),
        env=env,
    )


def parse_spec(data: Any, source: str) -> JobSpec:
    if not isinstance(data, dict):
        raise OrchError(f"{source} must be a YAML mapping of keys to values")
    try:
        return JobSpec.model_validate(data)
    except ValidationError as e:
        raise OrchError(format_validation_error(e, source)) from None
    except RecursionError:
        raise OrchError(f"{source} is nested too deeply; flatten it") from None


def load_job(path: str | Path) -> ResolvedJob:
    p = Path(path)
    spec = parse_spec(read_yaml(p, "job spec"), str(p))
    return resolve(spec, p)
