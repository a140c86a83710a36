"""Host syncs in the hot loop: the CPU waits for the GPU every step (`.item()`, `print(tensor)`,
`.cpu()`, `.tolist()`, `torch.cuda.synchronize()`, blocking DtoH copies), so the GPU's queue
drains and the GPU idles while the CPU refills it. Cost: that GPU idle right after the syncs
(view `sync_stats`, from metrics/sql/55_host_sync.sql), less the part the CPU spent in an
input-pipeline range or in work between steps (a data-loader stall or the between-steps
work, reported by their own rules). Only syncs in at least half of the steps: a few steps' many
(a checkpoint) are their work's; in a loop that keeps recording CUDA graphs, the steps that run
the model eagerly to warm up or record a new shape's graph (graph_eager_steps: CUDA graph trees
synchronise around both) are the recording's, which the cuda_graphs finding costs, and count
neither way. Where the job was replayed across ranks, the cost is the replay's: the
same job with no host sync (61_replay.sql, `no host syncs`: the CPU not blocked in them, the
GPU's idle after them gone, the input's and the between-steps work's left to their findings);
within the replay's error it is `info`. Otherwise (one GPU, no collective matched across ranks)
each rank's own GPU work is replayed without its syncs (55_own_replay.sql, `host syncs`: the
launches after a sync earlier by the time the CPU was blocked in it), which also counts the
launch gaps that follow the idle right after a sync, until the CPU is ahead of the GPU again:
that saving is the cost. Either way the finding needs the idle right after the syncs first, as
the replays' savings are estimates a measured pair has not held them to everywhere."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.analyze.model_replay import SYNCS
from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import (
    BETWEEN_STEPS_WORK,
    OWN_SYNCS,
    Context,
    Rule,
    finding,
    graph_eager_steps,
    own_replay,
    worst_first,
)
from orchestrator.analyze.units import ms
from orchestrator.metrics.engine import is_input_range

FIX = ("Keep values on the GPU inside the loop: accumulate the loss on device (`total += loss.detach()`) "
       "and call `.item()` / log every N steps; avoid `print(tensor)`, `.cpu()`, `.tolist()` and "
       "`torch.cuda.synchronize()` in the training loop; copy to the host with `.to('cpu', non_blocking=True)` "
       "into pinned memory. Find the sync points with `torch.cuda.set_sync_debug_mode(\"warn\")`.")


@dataclass
class HostSync(Rule):
    kind = "host_sync"
    explains_idle = True
    reads = ("sync_stats", "sync_idle_ranges", "sync_steps", "graph_eager_steps", "own_replay")
    # A sync at least this often per step on average is "in the hot loop" (per-step logging),
    # where at least this share of the steps holds one: the many syncs of a few steps (a
    # checkpoint's torch.save copies each tensor to the host) are that work's, which the
    # idle rules name by what the loop thread was in (cpu_gap, with orch's Python samples).
    min_per_step: float = 1.0
    min_steps_share: float = 0.5
    # Reported when the GPU idle right after the syncs is at least this share of the window.
    min_share: float = 0.02

    def evaluate(self, ctx: Context) -> list[Finding]:
        win = ctx.window_ms()
        hit: dict[int, tuple[dict, float]] = {}
        in_data: dict[int, float] = {}
        for g in ctx.views.rows("sync_idle_ranges"):
            if is_input_range(g["range_group"]) or g["range_group"] == BETWEEN_STEPS_WORK:
                in_data[g["rank"]] = in_data.get(g["rank"], 0.0) + ms(g["ns"])
        eager = graph_eager_steps(ctx)
        replay = ctx.report.replay
        gone = replay.removed(SYNCS) if replay else None
        stepped: dict[int, int] = {}  # the rank's own steps that hold a sync
        syncs: dict[int, int] = {}  # and their syncs
        for r in ctx.views.rows("sync_steps"):
            if r["step"] not in eager.get(r["rank"], ()):
                stepped[r["rank"]] = stepped.get(r["rank"], 0) + 1
                syncs[r["rank"]] = syncs.get(r["rank"], 0) + r["n"]
        replayed: set[int] = set()  # the ranks costed by their own replay: none across ranks costs the syncs
        own = own_replay(ctx, OWN_SYNCS)
        for s in ctx.views.rows("sync_stats"):
            rk, per = s["rank"], s["sync_per_step"]
            idle_ms = max(0.0, ms(s["idle_after_ns"]) - in_data.get(rk, 0.0))
            if per is None or not win.get(rk):
                continue
            graphed = s["n_steps"] - len(eager.get(rk, ()))  # the steps that replay their graphs, in such a loop
            if rk in eager:
                per = syncs.get(rk, 0) / graphed if graphed > 0 else 0.0
            if per < self.min_per_step or stepped.get(rk, 0) < self.min_steps_share * graphed:
                continue
            if idle_ms >= self.min_share * win[rk]:
                if gone is None:
                    idle_ms = own.get(rk, (0.0, 0.0))[0]
                    replayed.add(rk)
                hit[rk] = (s, idle_ms)
        if not hit:
            return []
        evidence = [self._said(s, idle, win[rk], in_data.get(rk, 0.0), rk in replayed)
                    for rk, (s, idle) in worst_first(hit, lambda v: v[1])]
        worst = max(100 * idle / win[rk] for rk, (_, idle) in hit.items())
        top = max(hit.values(), key=lambda v: v[1])[0]["top_name"]
        cost, severity = max(idle for _, idle in hit.values()), None
        if replay and gone:
            cost, worst = max(gone.saving_ms, 0.0), max(gone.saving_pct, 0.0)
            evidence.append(f"replayed with no host sync (the CPU runs on, the GPU's idle after them gone), the "
                            f"{gone.steps} steps take {gone.change}; the replay of the unchanged trace is within "
                            f"{replay.error_pct}% of it")
            if cost <= replay.error_ms:
                evidence.append(f"that saving is within the replay's error ({replay.error_ms} ms)")
                severity = "info"
        return [finding(self.kind, hit, f"GPU idle after host syncs every step (`{top}`)", evidence, FIX,
                        cost, pct=worst, severity=severity)]

    @staticmethod
    def _said(s: dict, cost: float, win: float, in_data: float, replayed: bool) -> str:
        """A rank's line: its syncs, and the cost its own replay gives (`replayed`) or the GPU's idle
        right after them."""
        rk, steps = s["rank"], s["n_steps"]
        line = (f"rank {rk}: {s['n_syncs']} host syncs in {steps} steps ({s['sync_per_step']:.1f} per step: "
                f"{s['names'] or s['top_name']}); CPU blocked in them {ms(s['blocked_ns'])} ms; ")
        if replayed:
            return line + (f"GPU idle right after them {ms(s['idle_after_ns'])} ms; replayed on its own GPU with "
                           f"no host sync (its launches after each sync earlier by the time the CPU was blocked "
                           f"in it; the unchanged trace replays exactly), its work in the {steps} steps ends "
                           f"{round(cost, 3)} ms earlier ({round(100 * cost / win, 1)}% of its window): the "
                           "idle right after the syncs and the launch gaps after it, until the CPU is ahead again")
        return line + (f"GPU idle right after them {round(cost / steps, 3)} ms per step ({round(100 * cost / win, 1)}% "
                       "of its window" + (", time in the input pipeline or in work between steps excluded: reported "
                                          "by their own findings" if in_data else "") + ")")


RULE = HostSync()
