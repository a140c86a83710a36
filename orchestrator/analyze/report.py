"""Assemble the typed cross-rank `Report` from the analysis views, then run the rules.

Every metric comes from a view in `analyze/sql/` (ns there); this module only converts units
(ns -> ms) and shapes rows into the models of `analyze/model.py`.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import duckdb

from orchestrator import __version__
from orchestrator.analyze.comm import build_comm
from orchestrator.analyze.critical import build_critical_path
from orchestrator.analyze.engine import Options, Views, analysis
from orchestrator.analyze.memory import build_memory
from orchestrator.analyze.model import (
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
from orchestrator.analyze.outcome import build_outcome
from orchestrator.analyze.rules import find_all
from orchestrator.analyze.rules.base import Context, ns_to_ms
from orchestrator.analyze.tables import build_tables
from orchestrator.collect.timings import phase


def _ms(ns: float | None) -> float | None:
    return None if ns is None else ns_to_ms(ns)


def _rank_metrics(v: Views, opts: Options) -> list[RankMetrics]:
    gaps_by: dict[int, dict[str, float]] = defaultdict(dict)
    for g in v.query("SELECT rank, range_group, sum(dur) AS ns FROM gap_attr GROUP BY ALL "
                     "ORDER BY rank, ns DESC, range_group"):
        gaps_by[g["rank"]][g["range_group"]] = ns_to_ms(g["ns"])
    top: dict[int, list[Gap]] = defaultdict(list)
    for g in v.query("""SELECT rank, s, dur, range_group, range_text FROM (
                            SELECT *, row_number() OVER (PARTITION BY rank ORDER BY dur DESC, s) AS i FROM gap_attr)
                        WHERE i <= ? ORDER BY rank, dur DESC, s""", [opts.top_gaps]):
        top[g["rank"]].append(Gap(start_ms=ns_to_ms(g["s"]), ms=ns_to_ms(g["dur"]), range=g["range_group"],
                                  text=g["range_text"]))
    steps: dict[int, list[StepTime]] = defaultdict(list)
    for s in v.query("SELECT rank, step, ns, warmup FROM step_gpu ORDER BY step, rank"):
        steps[s["rank"]].append(StepTime(step=s["step"], ms=ns_to_ms(s["ns"]), warmup=bool(s["warmup"])))
    sync = v.by_rank("sync_stats")
    out = []
    for r in v.rows("rank_metrics"):
        rk = r["rank"]
        sy = sync.get(rk) or {}
        out.append(RankMetrics(
            rank=rk, host=r["host"], stage=r["stage"], status=r["status"],
            window_ms=ns_to_ms(r["window_ns"]), compute_ms=ns_to_ms(r["compute_ns"]),
            comm_ms=ns_to_ms(r["comm_ns"]), overlap_ms=ns_to_ms(r["overlap_ns"]),
            comm_overlap_pct=r["comm_overlap_pct"], exposed_comm_ms=ns_to_ms(r["exposed_comm_ns"]),
            gpu_busy_ms=ns_to_ms(r["busy_ns"]), gpu_idle_pct=r["gpu_idle_pct"],
            no_compute_pct=r["no_compute_pct"], p2p_ms=ns_to_ms(r["p2p_ns"]),
            nccl_wait_ms=ns_to_ms(r["nccl_wait_ns"]), p2p_wait_ms=ns_to_ms(r["p2p_wait_ns"]),
            transfer_ms=ns_to_ms(r["transfer_ns"]), late_count=int(r["late_count"]),
            collectives=int(r["n_coll"]), mean_step_ms=_ms(r["mean_step_ns"]),
            median_step_ms=_ms(r["median_step_ns"]), p90_step_ms=_ms(r["p90_step_ns"]),
            sm_active_pct=r["sm_active_pct"], tensor_active_pct=r["tensor_active_pct"],
            sync_per_step=None if sy.get("sync_per_step") is None else round(sy["sync_per_step"], 2),
            sync_idle_ms_per_step=_ms(sy.get("idle_after_ns_per_step")),
            gaps_by_range_ms=gaps_by.get(rk, {}), top_gaps=top.get(rk, []), step_ms=steps.get(rk, []),
        ))
    return out


def _steps(v: Views) -> list[StepRow]:
    rows = v.query("""SELECT step, list(rank ORDER BY rank) AS ranks, list(ns ORDER BY rank) AS ns,
                             bool_or(warmup) AS warmup
                      FROM step_gpu WHERE rank IN (SELECT rank FROM rank_metrics) GROUP BY step ORDER BY step""")
    out = []
    for r in rows:
        vals = {str(k): ns_to_ms(ns) for k, ns in zip(r["ranks"], r["ns"], strict=True)}
        out.append(StepRow(step=r["step"], ms_by_rank=vals,
                           spread_ms=round(max(vals.values()) - min(vals.values()), 3), warmup=r["warmup"]))
    return out


def _window(v: Views, opts: Options, ranks: list[RankMetrics]) -> Window:
    src = v.query("SELECT family, pattern FROM step_source")
    per_rank = {r["rank"]: [ns_to_ms(r["w0"]), ns_to_ms(r["w1"])] for r in v.rows("rank_metrics")}
    sources = sorted({r["window_source"] for r in v.rows("rank_metrics")})
    if not src:
        note, step_source = "no step ranges found: the whole capture is the window", "none"
    else:
        note = "steps " + (f"{opts.steps[0]}..{opts.steps[1]}" if opts.steps else "after each rank's first")
        fam, pattern = src[0]["family"], src[0]["pattern"]
        if fam == 4:
            step_source = f"inferred iterations (no step markers): the period of `{pattern}`"
            acc = v.query("SELECT micro_batches AS k, micro_name FROM beat WHERE micro_batches > 1 "
                          "ORDER BY rank LIMIT 1")
            if acc:  # gradient accumulation: the iteration is the optimizer step
                step_source += (f" (an optimizer step of {acc[0]['k']} micro-batches, each the period of "
                                f"`{acc[0]['micro_name']}`)")
        else:
            label = {0: "--steps-from", 1: "numbered NVTX ranges", 2: "torch.profiler ProfilerStep ranges",
                     3: "repeated NVTX ranges"}[fam]
            step_source = f"{label} (e.g. `{pattern}`)"
    return Window(source=sources, steps=list(opts.steps) if opts.steps else None, gap_ms=opts.gap_ms, note=note,
                  step_source=step_source, per_rank=per_rank)


def _notes(v: Views) -> list[str]:
    notes = []
    for o in v.rows("collector_overhead"):
        notes.append(f"GPU metrics were sampled by rank(s) {', '.join(map(str, o['collectors']))} for their node: "
                     f"median step {ns_to_ms(o['collector_median_ns'])} ms there vs {ns_to_ms(o['others_median_ns'])} "
                     "ms on the other ranks (the difference includes any waiting for other ranks)")
    for o in v.query("SELECT list(DISTINCT rank ORDER BY rank) AS ranks, sum(out_of_range) AS n FROM gpu_metric_rank "
                     "HAVING sum(out_of_range) > 0"):
        notes.append(f"{o['n']} GPU metric samples outside 0..100 % (impossible) were left out of the means of "
                     f"rank(s) {', '.join(map(str, o['ranks']))}")
    notes += [o["note"] for o in v.rows("layout_notes")]  # what a cp/ep/vpp layout leaves unanalysed
    return notes


def build_report(store: Path, opts: Options, writer: duckdb.DuckDBPyConnection | None = None) -> Report:
    """The report of `store` (`writer`: the collect's open connection, engine.analysis)."""
    con, v = analysis(store, opts, writer)
    try:
        return report_from_views(v, store, opts)
    finally:
        con.close()


def report_from_views(v: Views, store: Path, opts: Options) -> Report:
    """The report from views that `analysis` has built (a caller that also reads other views,
    such as the HTML's timeline, runs the analysis once for both)."""
    with phase("report: metrics and tables"):
        report = _report(v, store, opts)
    with phase("report: rules"):
        report.findings = find_all(Context(views=v, report=report, opts=opts))
    return report


def _report(v: Views, store: Path, opts: Options) -> Report:
    ranks = _rank_metrics(v, opts)
    meta = {r["key"]: r["value"] for r in v.query("SELECT key, value FROM meta")}
    layout = json.loads(meta.get("layout", "{}"))
    all_ranks = v.query("SELECT rank, status, error FROM ranks ORDER BY rank")
    report = Report(
        orch_version=__version__, store=str(store), window=_window(v, opts, ranks), layout=layout,
        ranks=ranks, steps=_steps(v),
        stages=[StageMetrics(stage=s["stage"], ranks=s["ranks"], compute_ms=ns_to_ms(s["compute_ns"]),
                             bubble_pct=s["bubble_pct"], gpu_idle_pct=s["gpu_idle_pct"],
                             theory_bubble_pct=s["theory_bubble_pct"], microbatches=s["microbatches"],
                             excess_bubble_pct=s["excess_bubble_pct"])
                for s in v.rows("stage_metrics")],
        imbalance=next((Imbalance(**i) for i in v.rows("imbalance")), None),
        stragglers=[Straggler(rank=s["rank"], late_count=s["late_count"], collectives=s["collectives"],
                              group_size=s["group_size"], wait_caused_ms=ns_to_ms(s["wait_caused_ns"]),
                              median_lateness_ms=ns_to_ms(s["median_lateness_ns"]),
                              share_of_window_pct=s["share_of_window_pct"], p_value=float(f"{s['p_value']:.3g}"))
                    for s in sorted(v.rows("stragglers"), key=lambda s: -s["wait_caused_ns"])],
        missing_ranks=[r["rank"] for r in all_ranks if r["status"] == "missing"],
        problems=[Problem(rank=r["rank"], status=r["status"], reason=r["error"])
                  for r in all_ranks if r["status"] != "ok"],
        cpu_phases=[CpuPhase(rank=c["rank"], range=c["grp"], ms_per_step=ns_to_ms(c["ns_per_step"]),
                             steps=c["n_steps"]) for c in v.query("SELECT * FROM cpu_phases ORDER BY grp, rank")],
        gpu_activity=any(r.gpu_busy_ms > 0 for r in ranks),
        tables=build_tables(v, opts),
        comm=build_comm(v),
        memory=build_memory(v),
        critical_path=build_critical_path(v),
    )
    report.notes = _notes(v)
    report.outcome = build_outcome(v, store)  # before the rules: a job that did not complete is never healthy
    return report
