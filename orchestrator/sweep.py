"""`orch sweep`: one job per value (or combination) of some spec keys, compared side by side.

Tuning DataLoader workers, batch size or pinned memory "empirically" means running the job
once per setting and comparing step time and GPU idle; this does exactly that through the
same path as `orch submit` (`submit.core.submit`, `wait`), then `collect` and the analysis,
one run after another (runs in parallel would share the machine and skew the comparison).

`--set launch.env.NUM_WORKERS=0,2,4` sets a dotted key of the job spec to each value; list
items are addressed by index (`launch.args.5=0,20`). Values take the type of the value they
replace (strings under launch.env and launch.args); several `--set` make every combination.
The metric that picks the best value is the median step time: per step the slowest rank
(synchronous training runs at its pace), median over the steady steps.
"""

from __future__ import annotations

import copy
import itertools
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from orchestrator import progress
from orchestrator.analyze.model_sweep import Point, Sweep
from orchestrator.errors import OrchError

MAX_POINTS = 64


def parse_set(text: str) -> tuple[str, list[str]]:
    """`a.b.c=v1,v2` -> ("a.b.c", ["v1", "v2"])."""
    key, sep, vals = text.partition("=")
    key = key.strip()
    values = [v.strip() for v in vals.split(",")] if sep else []
    if not key or not values or any(not v for v in values) or any(not p for p in key.split(".")):
        raise OrchError(f"--set {text!r}: use KEY=V1,V2 with a dotted spec key, "
                        "e.g. --set launch.env.NUM_WORKERS=0,2,4")
    return key, values


def combinations(sets: list[tuple[str, list[str]]]) -> list[dict[str, str]]:
    keys = [k for k, _ in sets]
    if len(set(keys)) != len(keys):
        raise OrchError("--set: a key is given twice; put all its values in one --set (K=V1,V2)")
    combos = [dict(zip(keys, c, strict=True)) for c in itertools.product(*(v for _, v in sets))]
    if len(combos) > MAX_POINTS:
        raise OrchError(f"--set: {len(combos)} combinations is more than {MAX_POINTS} jobs; sweep fewer values")
    return combos


def _coerce(old: Any, value: str, as_text: bool) -> Any:
    if as_text or isinstance(old, str):
        return value
    parsed = yaml.safe_load(value)
    if isinstance(old, bool) and not isinstance(parsed, bool):
        raise OrchError(f"--set: {value!r} is not true/false")
    if isinstance(old, int | float) and not isinstance(old, bool) and not isinstance(parsed, int | float):
        raise OrchError(f"--set: {value!r} is not a number")
    return parsed


def apply(data: dict[str, Any], key: str, value: str) -> None:
    """Set dotted `key` in the raw spec mapping (creating mappings on the way)."""
    parts = key.split(".")
    node: Any = data
    for i, p in enumerate(parts):
        last = i == len(parts) - 1
        as_text = parts[:2] in (["launch", "env"], ["launch", "args"])
        if isinstance(node, list):
            if not p.isdigit() or int(p) >= len(node):
                raise OrchError(f"--set {key}: {p!r} is not an index of that list (0..{len(node) - 1})")
            if last:
                node[int(p)] = _coerce(node[int(p)], value, as_text)
                return
            node = node[int(p)]
        elif isinstance(node, dict):
            if last:
                node[p] = _coerce(node.get(p), value, as_text)
                return
            node = node.setdefault(p, {})
        else:
            raise OrchError(f"--set {key}: {'.'.join(parts[:i])} is a single value, not a mapping or list")


def _arg_note(raw: dict[str, Any], key: str) -> str | None:
    """`launch.args.5` is `--slow-ms`: say which flag an argument index is the value of."""
    parts = key.split(".")
    args = (raw.get("launch") or {}).get("args") if isinstance(raw.get("launch"), dict) else None
    if len(parts) == 3 and parts[:2] == ["launch", "args"] and parts[2].isdigit() and isinstance(args, list):
        i = int(parts[2])
        if 0 < i < len(args) and str(args[i - 1]).startswith("-"):
            return f"{key} is the value of {args[i - 1]}"
    return None


def job_step_ms(report: Any, extras: Any) -> float | None:
    """Median over steady steps of the slowest rank's step time (GPU spans, or NVTX steps on CPU)."""
    from orchestrator.analyze.timeline import step_times

    times = step_times(report, extras)
    per_step: dict[int, float] = {}
    for rk, by in times.items():
        for st, ms in by.items():
            if st != extras.first_step.get(rk, min(by)):
                per_step[st] = max(per_step.get(st, 0.0), ms)
    return round(statistics.median(per_step.values()), 3) if per_step else None


def measure(point: Point, store: Path, run: Path) -> None:
    """Analyse one finished job; its report.html/json go in its run directory."""
    from orchestrator.analyze.build import build_analysis
    from orchestrator.fsutil import write_text_atomic
    from orchestrator.metrics.engine import Options
    from orchestrator.report.html import render_html

    report, extras = build_analysis(store, Options())
    write_text_atomic(run / "report.json", report.model_dump_json(indent=1))
    write_text_atomic(run / "report.html", render_html(report, extras))
    point.report_html = str(run / "report.html")
    point.step_ms = job_step_ms(report, extras)
    if report.gpu_activity and report.ranks:
        point.gpu_idle_pct = round(statistics.mean(r.gpu_idle_pct for r in report.ranks), 2)
        per_rank = [sum(by.values()) / max(1, len(by)) for by in extras.wait_ms.values()]
        point.waiting_ms_per_step = round(statistics.mean(per_rank), 3) if per_rank else 0.0
    top = next((f for f in report.findings), None)
    point.top_finding = f"{top.severity}: {top.title}" if top else None


def run_sweep(job_path: Path, sets: list[tuple[str, list[str]]], runs: Path | None = None,
              timeout_s: float | None = None, log: Callable[[str], None] = print) -> Sweep:
    """Submit, wait for, collect and analyse one job per combination, one after another."""
    from orchestrator.collect.options import CollectOptions
    from orchestrator.collect.run import collect_run
    from orchestrator.spec.load import parse_spec, read_yaml, resolve
    from orchestrator.submit.backend import TERMINAL
    from orchestrator.submit.core import submit, wait

    raw = read_yaml(job_path, "job spec")
    combos = combinations(sets)
    jobs = []
    for i, combo in enumerate(combos):  # every combination validates before anything is submitted
        data = copy.deepcopy(raw)
        for k, v in combo.items():
            apply(data, k, v)
        data["name"] = f"{raw.get('name', 'job')}-sweep{i}"
        desc = f"{job_path} with " + ", ".join(f"{k}={v}" for k, v in combo.items())
        jobs.append(resolve(parse_spec(data, desc), job_path))
    sweep = Sweep(job=str(job_path), keys=[k for k, _ in sets], points=[Point(values=c) for c in combos],
                  notes=[n for k, _ in sets if (n := _arg_note(raw, k))])
    with progress.task("sweep: jobs", total=len(jobs)) as shown:
        for i, (job, point) in enumerate(zip(jobs, sweep.points, strict=True)):
            shown.update(completed=i, description=f"sweep: {point.label}")
            run, m = submit(job, runs)
            point.job_id, point.run = m.job_id, str(run)
            log(f"sweep: {point.label}: submitted as job {m.job_id} ({m.executor}); run directory {run}")
            st = wait(run, timeout_s=timeout_s)
            point.state = st["state"]
            if st["state"] != "COMPLETED":
                ended = "ended" if st["state"] in TERMINAL else f"still {st['state']} after --timeout:"
                point.error = f"job {ended} {st['state'] if ended == 'ended' else ''}".strip() + \
                    f"; see `orch status {m.job_id}`"
                log(f"sweep: {point.label}: {point.error}")
                continue
            try:
                res = collect_run(run, CollectOptions())
                measure(point, res.store, run)
            except OrchError as e:
                point.error = str(e)
                log(f"sweep: {point.label}: {e}")
                continue
            sweep.gpu = sweep.gpu or point.gpu_idle_pct is not None
            log(f"sweep: {point.label}: median step {point.step_ms} ms")
    done = [i for i, p in enumerate(sweep.points) if p.step_ms is not None]
    sweep.best = min(done, key=lambda i: sweep.points[i].step_ms) if done else None  # type: ignore[arg-type,return-value]
    return sweep
