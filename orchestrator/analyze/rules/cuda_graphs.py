"""A loop that already replays CUDA graphs (torch.compile mode="reduce-overhead", captured
steps): how much of the GPU time the graphs hold, what runs outside them, and what the loop
thread does between two replays. The advice for such a loop is to capture more of the step or
give each replay more work, never to adopt CUDA graphs; for one that keeps recording graphs (a
new one for each new input shape), to keep its shapes few."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import (
    Context,
    Rule,
    finding,
    graph_eager_steps,
    one_offs,
    overhead_error_ms,
    severity_for,
)
from orchestrator.analyze.units import ms

FIX = ("The loop already replays CUDA graphs; the GPU idles on what still runs outside them. Capture more of "
       "the step: the optimizer step and gradient clipping (torch.compile the function that calls "
       "optimizer.step(), or capture it in the same torch.cuda.graph), the loss and metrics, and keep "
       "graph breaks out of the model (torch._dynamo.explain); cut the Python between replays "
       "(no per-step .item() or logging); or give each replay more work (a larger per-step batch).")
SHAPES_FIX = ("The loop keeps recording CUDA graphs: torch.compile(mode=\"reduce-overhead\") records one for each "
              "new input shape (CUDA graph trees), after an eager warm-up run of it, and replays a graph only once its "
              "shape comes again. Pad the inputs to a few fixed shapes (a collator's pad_to_multiple_of, e.g. "
              "DataCollatorWithPadding(pad_to_multiple_of=64), or length buckets), or where shapes must vary run "
              "those graphs without CUDA graphs (torch._inductor.config.triton.cudagraph_skip_dynamic_graphs = True); "
              "a loop that captures its own torch.cuda.graph should capture once per shape and replay it.")
GRAPH_SPAN_NOTE = ("graph-level tracing (nsys --cuda-graph-trace=graph, the default) times each replay as one "
                   "span that includes the idle between its nodes; --cuda-graph-trace=node times each kernel")


@dataclass
class CudaGraphs(Rule):
    kind = "cuda_graphs"
    # graph_eager_steps: a rank's steps that warm up or record graphs, where graphs are recorded
    # in 3 or more of its steps (recording recurs, for new input shapes: a loop whose shapes repeat
    # records its graphs in its first steps only).
    reads = ("graph_usage", "capture_overhead", "oneoff_gaps", "graph_eager_steps")

    def evaluate(self, ctx: Context) -> list[Finding]:
        win = ctx.window_ms()
        busy = {r.rank: r.gpu_busy_ms for r in ctx.report.ranks}
        rows = [r for r in ctx.views.rows("graph_usage") if win.get(r["rank"])]
        if not rows:
            return []
        evidence, idle = [], {}
        for r in rows:
            rk, steps = r["rank"], r["n_steps"] or 0
            per = f" ({r['replays'] / steps:.1f} per step)" if steps else ""
            evidence.append(
                f"rank {rk}: {r['replays']} graph replays{per}; {ms(r['graph_busy_ns'])} ms of its "
                f"{ms(r['busy_ns'])} ms of GPU work ran inside CUDA graphs ({r['graph_share_pct']}%), "
                f"{ms(r['eager_kernel_ns'])} ms in {r['eager_kernels']} kernels launched outside them"
                + (f" (most time: {r['top_eager']})" if r["top_eager"] else ""))
            if r["between_ns"]:
                parts = [(r["launch_ns"], "launching eager kernels"), (r["sync_ns"], "in host syncs"),
                         (r["copy_ns"], "in copies"), (r["other_api_ns"], "in other CUDA calls"),
                         (r["python_ns"], "in no CUDA call (Python, or in backward() waiting for the autograd thread)")]
                scale = f"{ms(r['between_ns'] / steps)} ms per step" if steps else \
                    f"{ms(r['between_ns'])} ms"
                evidence.append(f"rank {rk}: between replays ({scale}) the loop thread was " + ", ".join(
                    f"{round(100 * ns / r['between_ns'])}% {what}" for ns, what in sorted(parts, reverse=True)
                    if round(100 * ns / r["between_ns"])))
            idle[rk] = max(0.0, win[rk] - busy.get(rk, 0.0))
        eager = graph_eager_steps(ctx)  # each recording rank's steps that run the model eagerly
        recording = [r for r in rows if r["rank"] in eager]
        evidence += [f"rank {r['rank']}: {r['captures']} CUDA graphs recorded (stream captures begun) in "
                     f"{r['capture_steps']} of its {r['n_steps']} analysed steps, and {len(eager[r['rank']])} of those "
                     "steps ran the model eagerly (a new shape's warm-up, or its recording); a loop whose shapes "
                     "repeat records its graphs once, in its first steps" for r in recording]
        # A one-off step's idle (the step that records the graphs) recurs nowhere else.
        once = {rk: o for rk, o in one_offs(ctx).items() if rk in idle}
        evidence += [line for rk, o in sorted(once.items()) for line in o.lines(rk)]
        idle = {rk: max(0.0, idle[rk] - (once[rk].total_ms if rk in once else 0.0)) for rk in idle}
        # Between replays the loop thread runs eager CUDA calls, each lengthened by nsys' per-call
        # cost (capture_overhead): the saving is this capture's idle, the severity what is left
        # of it without the profiler (as launch_bound's).
        over = ctx.views.by_rank("capture_overhead")
        nsys = {rk: min(ms(over[rk]["est_ns"]), idle[rk]) for rk in idle if rk in over and over[rk]["est_ns"]}
        evidence += [f"rank {rk}: ≈ {round(ns, 3)} ms of that idle is nsys' own per-call cost (estimated from "
                     f"{over[rk]['api_calls']} traced CUDA calls): without the profiler the GPU idles about "
                     f"{round(idle[rk] - ns, 3)} ms" for rk, ns in sorted(nsys.items()) if ns]
        if any(r["graph_level"] for r in rows):
            evidence.append(GRAPH_SPAN_NOTE)
        worst = max(idle, key=lambda rk: idle[rk] / win[rk])
        share = min(r["graph_share_pct"] for r in rows)
        pct = round(100 * idle[worst] / win[worst], 1)
        if recording:
            steps = max(recording, key=lambda r: r["capture_steps"])
            title = (f"CUDA graphs recorded anew for new input shapes in {steps['capture_steps']} of "
                     f"{steps['n_steps']} steps: the GPU idle {pct}% of the window")
        else:
            title = (f"CUDA graphs replayed: {share}% of GPU time inside graphs, the GPU idle {pct}% of the window "
                     "between them")
        return [finding(
            self.kind, [r["rank"] for r in rows], title,
            evidence, SHAPES_FIX if recording else FIX, idle[worst], pct=100 * idle[worst] / win[worst],
            severity=severity_for(max(100 * (idle[rk] - nsys.get(rk, 0.0)) / win[rk] for rk in idle)),
            unprofiled_ms=idle[worst] - nsys[worst] if nsys.get(worst) else None,
            unprofiled_err_ms=overhead_error_ms(over[worst], nsys[worst]) if nsys.get(worst) else None)]


RULE = CudaGraphs()
