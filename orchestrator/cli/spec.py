"""`orch validate` and `orch render`: the spec stage (nothing is submitted)."""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.cli.common import Handler, check_output_dir, out


def cmd_validate(a: argparse.Namespace) -> int:
    from rich.markup import escape

    from orchestrator.render import render
    from orchestrator.spec import load_job
    from orchestrator.spec.ranks import format_ranges

    job = load_job(a.job)
    render(job, Path(a.job).resolve().parent / ".orch-validate")  # renders in memory only
    out.print(
        f"[green]ok[/green] {escape(a.job)}: {job.spec.name} on {escape(job.cluster.name)} "
        f"({job.cluster.executor}), {job.nodes} node(s) x {job.nproc_per_node} = world {job.world_size}, "
        f"layout {job.layout.describe()}, profiled ranks {format_ranges(job.profiled_ranks)}"
        + (f", GPU metrics {escape(job.gpu_metrics_set)} on ranks {format_ranges(job.collector_ranks)}"
           if job.gpu_metrics_set else "")
    )
    return 0


def cmd_render(a: argparse.Namespace) -> int:
    from orchestrator.render import render
    from orchestrator.spec import load_job

    job = load_job(a.job)
    dest = Path(a.output or f"orch-render-{job.spec.name}")
    check_output_dir(str(dest), "-o")
    rendered = render(job, dest / "scripts")
    rendered.write()
    for name in rendered.scripts:
        out.print(f"wrote {rendered.script_dir / name}", markup=False)
    out.print(f"reports will be written as {rendered.report_pattern}.nsys-rep", markup=False)
    return 0


def register(sub: argparse._SubParsersAction) -> dict[str, Handler]:
    p = sub.add_parser("validate", help="check a job spec and its cluster config")
    p.add_argument("job", help="job.yaml")
    p = sub.add_parser("render", help="write sbatch.sh, launch.sh and rank_wrapper.sh")
    p.add_argument("job", help="job.yaml")
    p.add_argument("-o", "--output", help="directory (default ./orch-render-NAME); scripts go in DIR/scripts")
    return {"validate": cmd_validate, "render": cmd_render}
