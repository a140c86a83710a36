"""Render a resolved job into the scripts that run it.

- `rank_wrapper.sh`: per rank; decides whether this rank runs under nsys.
- `launch.sh`: per node; torchrun over the wrapper. The ONE command line: sbatch.sh runs it
  through srun, `orch submit` runs it through submitit, a user can run it by hand.
- `sbatch.sh`: a standalone batch script (`#SBATCH` lines, setup, srun launch.sh).
- `keep_report.sh`: per profiled rank, once its nsys ended: makes the report from nsys' raw
  stream when a signal stopped nsys before it wrote it.
- `export_report.sh`: per profiled rank, once its report is complete: the SQLite export that
  `orch collect` would make, made in the job (profile.export_in_job).
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import jinja2

import orchestrator
from orchestrator import __version__, naming
from orchestrator.errors import OrchError
from orchestrator.fsutil import write_text_atomic
from orchestrator.limits import stop_timing
from orchestrator.nsys import UNKNOWN_OPTION_ERE
from orchestrator.render.nsys_args import metrics_args, newer_export_args, profile_args
from orchestrator.runpaths import RunPaths
from orchestrator.spec.load import ResolvedJob
from orchestrator.spec.ranks import format_ranges, to_ranges

SCRIPTS = ("sbatch.sh", "launch.sh", "rank_wrapper.sh", "keep_report.sh", "export_report.sh")
HOOK_DIR = "pyhooks"  # launch.sh puts it first on the ranks' PYTHONPATH (sitecustomize: stack dumps)
HOOKS = ("sitecustomize.py", "orch_loop_marks.py")  # what goes there (loop marks, Python samples)
# Paths that appear in `#SBATCH` lines, which sbatch (not a shell) parses.
_SAFE_PATH_RE = re.compile(r"^[A-Za-z0-9_./+,:@%=-]+$")


@dataclass(frozen=True)
class Rendered:
    """The rendered scripts and where they expect to live."""

    script_dir: Path
    report_dir: Path
    log_dir: Path
    scripts: dict[str, str]
    node_command: list[str]  # what each node runs: [container prefix...] bash launch.sh
    report_pattern: str  # nsys `-o` value, with %q{ORCH_JOB_ID}, %q{RANK}, %h, %p
    hooks: dict[str, str] = field(default_factory=dict)  # Python files for the ranks' PYTHONPATH

    def write(self) -> None:
        """Write all scripts, each via a temp file + rename, so a failure leaves no partial file."""
        self.script_dir.mkdir(parents=True, exist_ok=True)
        for name, text in self.scripts.items():
            write_text_atomic(self.script_dir / name, text, mode=0o755)
        for name, text in self.hooks.items():
            (self.script_dir / HOOK_DIR).mkdir(exist_ok=True)
            write_text_atomic(self.script_dir / HOOK_DIR / name, text, mode=0o644)


def shell_quote(value: object) -> str:
    """shlex.quote, plus quotes around commas so shellcheck reads `'--trace=a,b'` as one word."""
    q = shlex.quote(str(value))
    return f"'{q}'" if "," in q and not q.startswith("'") else q


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.files("orchestrator.templates"))),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,  # shell, not HTML: every user string goes through `q` instead
        # bash's ${#array[@]} would open a Jinja comment: comments use {## ##} instead.
        comment_start_string="{##",
        comment_end_string="##}",
    )
    env.filters["q"] = shell_quote
    return env


def sbatch_lines(job: ResolvedJob) -> list[str]:
    s = job.slurm
    lines = []
    for opt, value in (
        ("partition", s.partition), ("account", s.account), ("qos", s.qos),
        ("time", s.time), ("constraint", s.constraint), ("mem", s.mem),
        ("cpus-per-task", s.cpus_per_task),
    ):
        if value is not None:
            lines.append(f"--{opt}={value}")
    if job.gpus_per_node:
        lines.append(f"--gpus-per-node={job.gpus_per_node}")
    if s.exclusive:
        lines.append("--exclusive")
    lines.extend(s.extra_sbatch or [])
    return lines


def node_command(job: ResolvedJob, script_dir: Path) -> list[str]:
    prefix = shlex.split(job.slurm.container_exec) if job.slurm.container_exec else []
    return [*prefix, "bash", str(script_dir / "launch.sh")]


def render(job: ResolvedJob, script_dir: Path, report_dir: Path | None = None,
           log_dir: Path | None = None) -> Rendered:
    script_dir = script_dir.resolve()
    out = job.spec.profile.output_dir
    if report_dir is None:
        report_dir = Path(out).expanduser() if out else RunPaths(script_dir.parent).reports
        if not report_dir.is_absolute():
            base = job.spec_path.parent.resolve() if job.spec_path else Path.cwd()
            report_dir = base / report_dir
    log_dir = (log_dir or RunPaths(script_dir.parent).logs).resolve()
    for label, p in (("output directory", script_dir), ("log directory", log_dir)):
        if not _SAFE_PATH_RE.fullmatch(str(p)):
            raise OrchError(
                f"{label} {str(p)!r} has spaces or special characters that #SBATCH lines "
                "cannot carry; choose a plain path (letters, digits, ._-/)"
            )
    stem = naming.report_stem(job.output_name)
    nc = node_command(job, script_dir)
    prof = job.spec.profile
    timing = stop_timing(job.slurm.time, prof.warn_lead_s, prof.stop_grace_s)
    ctx = {
        "job": job,
        "version": __version__,
        "script_dir": str(script_dir),
        "log_dir": str(log_dir),
        "report_dir": str(report_dir),
        "report_pattern": str(report_dir / stem),
        "nsys": job.cluster.nsys.path,
        "nsys_args": profile_args(job),
        "metrics_args": metrics_args(job),
        "nvtx_capture": job.spec.profile.capture_range == "nvtx",
        "profiled_ranges": to_ranges(job.profiled_ranks),
        "profiled_text": format_ranges(job.profiled_ranks),
        "collector_ranges": to_ranges(job.collector_ranks),
        "collector_text": format_ranges(job.collector_ranks),
        "env": sorted(job.env.items()),
        "port": job.spec.launch.rdzv.port,
        "rdzv_backend": job.spec.launch.rdzv.backend,
        "python": job.spec.launch.python or job.cluster.python,
        "sbatch_lines": sbatch_lines(job),
        "setup": list(job.slurm.setup or []),
        "modules": list(job.slurm.modules or []),
        "node_command": nc,
        "timing": timing,
        "dump_dir": str(RunPaths(log_dir.parent).dumps),
        "export_in_job": prof.export_in_job,
        "export_dir": str(RunPaths(script_dir.parent).exports),
        "export_timeout_s": prof.export_timeout_s,
        "newer_export_args": newer_export_args(job),
        "map_in_job": prof.maps_in_job,
        "loop_marks": prof.loop_marks,
        "python_sampling_ms": prof.python_sampling_ms,
        "module_marks": prof.module_marks,
        "run_dir": str(script_dir.parent),
        "orch_python": sys.executable,
        "orch_root": str(Path(orchestrator.__file__).resolve().parent.parent),
        "unknown_option_ere": UNKNOWN_OPTION_ERE,
        # Where a rank's raw nsys stream is kept (a hard link beside it, so under nsys' TMPDIR):
        # the wrapper links it, keep_report.sh reads it; append "$RANK.qdstrm".
        "kept_stream_prefix": "${TMPDIR:-/tmp}/orch-kept-${ORCH_JOB_ID:-local}-r",
    }
    env = _env()
    scripts = {name: env.get_template(f"{name}.j2").render(**ctx) for name in SCRIPTS}
    hooks = {name: env.get_template(f"{name}.j2").render(**ctx) for name in HOOKS}
    return Rendered(script_dir=script_dir, report_dir=report_dir, log_dir=log_dir,
                    scripts=scripts, node_command=nc,
                    report_pattern=str(report_dir / stem), hooks=hooks)
