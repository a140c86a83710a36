"""Assemble the typed cross-rank `Report` from the analysis views, then run the rules.

Every metric comes from a view in `metrics/sql/` (ns there); this module only converts units
(ns -> ms) and shapes rows into the models of `analyze/model_report.py`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from orchestrator import __version__
from orchestrator.analyze.comm import build_comm
from orchestrator.analyze.critical import build_critical_path
from orchestrator.analyze.gpu_memory import build_memory
from orchestrator.analyze.model_columns import Column, columns
from orchestrator.analyze.model_report import (
    CpuPhase,
    Gap,
    Imbalance,
    Problem,
    RankMetrics,
    Report,
    StageMetrics,
    StepRow,
    StepTime,
    Straggler,
    Window,
)
from orchestrator.analyze.outcome import build_outcome, evidence
from orchestrator.analyze.overhead import build_overhead
from orchestrator.analyze.replay import build_replay
from orchestrator.analyze.rules import find_all
from orchestrator.analyze.rules.base import Context
from orchestrator.analyze.stats_tables import build_tables
from orchestrator.analyze.units import ms, ms_or_none
from orchestrator.metrics.engine import Options, Views, analysis
from orchestrator.timings import phase

if TYPE_CHECKING:
    from orchestrator.analyze.model_timeline import Extras


def _rank_metrics(v: Views, opts: Options) -> list[RankMetrics]:
    gaps_by: dict[int, dict[str, float]] = defaultdict(dict)
    for g in v.query("SELECT rank, range_group, sum(dur) AS ns FROM gap_attr GROUP BY ALL "
                     "ORDER BY rank, ns DESC, range_group"):
        gaps_by[g["rank"]][g["range_group"]] = ms(g["ns"])
    top: dict[int, list[Gap]] = defaultdict(list)
    for g in v.query("""SELECT rank, s, dur, range_group, range_text FROM (
                            SELECT *, row_number() OVER (PARTITION BY rank ORDER BY dur DESC, s) AS i FROM gap_attr)
                        WHERE i <= ? ORDER BY rank, dur DESC, s""", [opts.top_gaps]):
        top[g["rank"]].append(Gap(start_ms=ms(g["s"]), ms=ms(g["dur"]), range=g["range_group"],
                                  text=g["range_text"]))
    steps: dict[int, list[StepTime]] = defaultdict(list)
    for s in v.query("SELECT rank, step, ns, warmup FROM step_gpu ORDER BY step, rank"):
        steps[s["rank"]].append(StepTime(step=s["step"], ms=ms(s["ns"]), warmup=bool(s["warmup"])))
    cols = {name: c for name, c in columns(RankMetrics).items() if c.view}
    rows = {view: v.by_rank(view) for view in {c.view for c in cols.values()}}
    out = []
    for r in v.rows("rank_metrics"):
        rk = r["rank"]
        fields = {name: _value(name, c, rows[c.view].get(rk) or {}) for name, c in cols.items()}
        out.append(RankMetrics(**fields, gaps_by_range_ms=gaps_by.get(rk, {}), top_gaps=top.get(rk, []),
                               step_ms=steps.get(rk, [])))
    return out


def _value(field: str, col: Column, row: dict[str, Any]) -> Any:
    """A field from its view row: a time in ns converted to ms (µs; a missing time stays missing
    where the field may be None, else counts as 0), anything else as the view has it."""
    x = row.get(col.source_of(field))
    if "_ms" in field:
        return ms_or_none(x) if RankMetrics.model_fields[field].default is None else ms(x)
    if x is not None and col.digits is not None:
        return round(x, col.digits)
    return x


def _steps(v: Views) -> list[StepRow]:
    rows = v.query("""SELECT step, list(rank ORDER BY rank) AS ranks, list(g.ns ORDER BY rank) AS ns,
                             bool_or(warmup) AS warmup, bool_and(complete) AS complete,
                             coalesce(bool_or(a.oneoff), false) AS oneoff
                      FROM step_gpu g LEFT JOIN analysed_steps a USING (rank, step)
                      WHERE rank IN (SELECT rank FROM rank_metrics) GROUP BY step ORDER BY step""")
    out = []
    for r in rows:
        vals = {str(k): ms(ns) for k, ns in zip(r["ranks"], r["ns"], strict=True)}
        out.append(StepRow(step=r["step"], ms_by_rank=vals,
                           spread_ms=round(max(vals.values()) - min(vals.values()), 3), warmup=r["warmup"],
                           complete=r["complete"], oneoff=r["oneoff"]))
    return out


def _window(v: Views, opts: Options, ranks: list[RankMetrics]) -> Window:
    src = v.query("SELECT family, pattern FROM step_source")
    per_rank = {r["rank"]: [ms(r["w0"]), ms(r["w1"])] for r in v.rows("rank_metrics")}
    sources = sorted({r["window_source"] for r in v.rows("rank_metrics")})
    if not src:
        note, step_source = "no step ranges found: the whole capture is the window", "none"
    else:
        note = "steps " + (f"{opts.steps[0]}..{opts.steps[1]}" if opts.steps else "after each rank's first")
        fam, pattern = src[0]["family"], src[0]["pattern"]
        if fam == 5:
            step_source = f"inferred iterations (no step markers): the period of `{pattern}`"
            acc = v.query("SELECT micro_batches AS k, micro_name FROM beat WHERE micro_batches > 1 "
                          "ORDER BY rank LIMIT 1")
            if acc:  # gradient accumulation: the iteration is the optimizer step
                step_source += (f" (an optimizer step of {acc[0]['k']} micro-batches, each the period of "
                                f"`{acc[0]['micro_name']}`)")
        else:
            label = {0: "--steps-from", 1: "numbered NVTX ranges", 2: "torch.profiler ProfilerStep ranges",
                     3: "repeated NVTX ranges",
                     4: "orch's loop marks: from one optimizer step's end to the next's"}[fam]
            step_source = f"{label} (e.g. `{pattern}`)"
            acc = v.query("SELECT k FROM step_accum ORDER BY rank LIMIT 1")
            if acc:  # gradient accumulation: k ranges (micro-batches) to an optimizer step
                step_source += f", {acc[0]['k']} to an optimizer step (the optimizer runs in every {acc[0]['k']}th)"
    return Window(source=sources, steps=list(opts.steps) if opts.steps else None, gap_ms=opts.gap_ms, note=note,
                  step_source=step_source, per_rank=per_rank)


def _notes(v: Views) -> list[str]:
    notes = []
    for o in v.rows("collector_overhead"):
        notes.append(f"GPU metrics were sampled by rank(s) {', '.join(map(str, o['collectors']))} for their node: "
                     f"median step {ms(o['collector_median_ns'])} ms there vs {ms(o['others_median_ns'])} "
                     "ms on the other ranks (the difference includes any waiting for other ranks)")
    for o in v.query("SELECT list(DISTINCT rank ORDER BY rank) AS ranks, sum(out_of_range) AS n FROM gpu_metric_rank "
                     "HAVING sum(out_of_range) > 0"):
        notes.append(f"{o['n']} GPU metric samples outside 0..100 % (impossible) were left out of the means of "
                     f"rank(s) {', '.join(map(str, o['ranks']))}")
    notes += [o["note"] for o in v.rows("layout_notes")]  # what a cp/ep/vpp layout leaves unanalysed
    return notes


def _one_saving(report: Report) -> None:
    """Where the job was replayed, a root's saving in the critical path's table is its what-if's,
    the number its straggler finding costs: one saving per root in every part of the report."""
    if report.critical_path is None:
        return
    for h in report.critical_path.held_by:
        what_if = report.what_if(h.rank)
        if what_if is not None:
            h.saving_ms = what_if.saving_ms


def build_report(store: Path, opts: Options, writer: duckdb.DuckDBPyConnection | None = None) -> Report:
    """The report of `store` (`writer`: the collect's open connection, engine.analysis)."""
    con, v = analysis(store, opts, writer)
    try:
        return report_from_views(v, store, opts)
    finally:
        con.close()


def build_analysis(store: Path, opts: Options, writer: duckdb.DuckDBPyConnection | None = None, *,
                   timeline: bool = True) -> tuple[Report, Extras | None]:
    """The analysis product: the report and the timeline the HTML draws, from ONE analysis pass
    over the store (`writer`: as for build_report). Every output (terminal, JSON, HTML) renders
    this report; none chooses what is analysed. The timeline's data (the drawn ranks' kernels,
    NVTX ranges and waits) is only drawn: without `timeline` it is not read (None)."""
    con, v = analysis(store, opts, writer)
    try:
        report = report_from_views(v, store, opts)
        if not timeline:
            return report, None
        from orchestrator.analyze.timeline import extras_from_views  # (drawn by the HTML alone)

        with phase("report: timeline extras"):
            return report, extras_from_views(v, report)
    finally:
        con.close()


def report_from_views(v: Views, store: Path, opts: Options) -> Report:
    """The report from views that `analysis` has built (a caller that also reads other views,
    such as the HTML's timeline, runs the analysis once for both)."""
    with phase("report: metrics"):
        report = _report(v, store, opts)
    with phase("report: rules"):
        report.findings = find_all(Context(views=v, report=report, opts=opts))
    with phase("report: tables"):
        report.tables = build_tables(v, opts, report)
    return report


def _report(v: Views, store: Path, opts: Options) -> Report:
    ranks = _rank_metrics(v, opts)
    meta = {r["key"]: r["value"] for r in v.query("SELECT key, value FROM meta")}
    layout = json.loads(meta.get("layout", "{}"))
    all_ranks = v.query("SELECT rank, status, error FROM ranks ORDER BY rank")
    report = Report(
        orch_version=__version__, store=str(store), window=_window(v, opts, ranks), layout=layout,
        ranks=ranks, steps=_steps(v),
        stages=[StageMetrics(stage=s["stage"], ranks=s["ranks"], compute_ms=ms(s["compute_ns"]),
                             bubble_pct=s["bubble_pct"], gpu_idle_pct=s["gpu_idle_pct"],
                             peer_wait_pct=s["peer_wait_pct"],
                             theory_bubble_pct=s["theory_bubble_pct"], microbatches=s["microbatches"],
                             excess_bubble_pct=s["excess_bubble_pct"])
                for s in v.rows("stage_metrics")],
        imbalance=next((Imbalance(**i) for i in v.rows("imbalance")), None),
        stragglers=[Straggler(rank=s["rank"], late_count=s["late_count"], collectives=s["collectives"],
                              group_size=s["group_size"], wait_caused_ms=ms(s["wait_caused_ns"]),
                              median_lateness_ms=ms(s["median_lateness_ns"]),
                              share_of_window_pct=s["share_of_window_pct"], p_value=float(f"{s['p_value']:.3g}"))
                    for s in sorted(v.rows("stragglers"), key=lambda s: -s["wait_caused_ns"])],
        missing_ranks=[r["rank"] for r in all_ranks if r["status"] == "missing"],
        problems=[Problem(rank=r["rank"], status=r["status"], reason=r["error"])
                  for r in all_ranks if r["status"] != "ok"],
        cpu_phases=[CpuPhase(rank=c["rank"], range=c["grp"], ms_per_step=ms(c["ns_per_step"]),
                             steps=c["n_steps"]) for c in v.query("SELECT * FROM cpu_phases ORDER BY grp, rank")],
        gpu_activity=any(r.gpu_busy_ms > 0 for r in ranks),
        comm=build_comm(v),
        memory=build_memory(v),
        critical_path=build_critical_path(v),
        replay=build_replay(v),
        capture_overhead=build_overhead(v),
    )
    _one_saving(report)
    report.notes = _notes(v)
    report.outcome = build_outcome(v)  # before the rules: a job that did not complete is never healthy
    ev = evidence(v)
    report.loaders = ev.loaders if ev else {}
    return report
