"""A slow link or node: communication whose transfer bandwidth (waiting for late ranks already
taken out, so a merely late rank never shows here) is an outlier.

Two tests, each on bus bandwidth for one collective kind and message-size bucket:
- against peers: a communicator group or p2p pair whose median busbw is under `ratio` of the
  median of the other groups/pairs of the same kind, size bucket and scope, and below them by
  more than `mad_k` MADs (robust across instances and peers). Ranks in every slow unit are named
  as the likely node; units of two ranks name the node pair.
- against the link: intra-node traffic of large messages (>= `min_bytes`, where NCCL reaches
  its plateau) below `min_nominal_pct` of the GPU's nominal NVLink rate: all ranks of one host
  being equally slow has no peer to stand out from, but the link says what it should carry.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass

from orchestrator.analyze.model_comm import CommUnitRow
from orchestrator.analyze.model_report import Finding
from orchestrator.analyze.rules.base import Context, Rule, finding
from orchestrator.ranklist import ranges

FIX = ("Check the link these ranks use: `nvidia-smi topo -m` (NV# between the GPUs, not PHB/SYS), "
       "`nvidia-smi nvlink -s` and `nvidia-smi nvlink -e` (link speed and error counters), that "
       "NCCL_P2P_DISABLE / NCCL_SHM_DISABLE / NCCL_P2P_LEVEL are not set by mistake (NCCL_DEBUG=INFO "
       "prints the transport per channel: P2P/CUMEM or NVLS vs NET/Socket), for inter-node traffic the "
       "NIC/IB port state and rate (`ibstat`, `ibv_devinfo`), NCCL_IB_HCA / NCCL_SOCKET_IFNAME pointing "
       "at the right HCA, and the GPU-NIC PCIe placement (same PCIe switch / NUMA node).")


@dataclass
class SlowLink(Rule):
    kind = "slow_link"
    reads = ()
    ratio: float = 0.5  # a unit slower than half its peers' median busbw
    mad_k: float = 3.0  # ... and below them by more than this many MADs
    min_instances: int = 2  # per unit and bucket
    min_bytes: int = 64 << 20  # link test: messages this large reach NCCL's plateau
    min_nominal_pct: float = 20.0  # link test: busbw under this share of the nominal rate

    def evaluate(self, ctx: Context) -> list[Finding]:
        comm = ctx.report.comm
        if comm is None or comm.size_source == "none":
            return []
        return self._peers(ctx, comm.by_unit) + self._link(ctx)

    def _peers(self, ctx: Context, units: list[CommUnitRow]) -> list[Finding]:
        by: dict[tuple[str, int, str], list[CommUnitRow]] = defaultdict(list)
        for u in units:
            if u.median_busbw_gbps is not None and u.instances >= self.min_instances:
                by[(u.kind, u.bucket_bytes, u.scope)].append(u)
        slow: list[tuple[CommUnitRow, float]] = []
        for peers in by.values():
            if len(peers) < 3:
                continue
            for u in peers:
                others = [p.median_busbw_gbps or 0.0 for p in peers if p is not u]
                med = statistics.median(others)
                mad = statistics.median(abs(x - med) for x in others)
                if u.median_busbw_gbps < self.ratio * med and med - u.median_busbw_gbps > self.mad_k * mad:
                    slow.append((u, med))
        if not slow:
            return []
        counts: dict[int, int] = defaultdict(int)
        for u, _ in slow:
            for r in u.ranks:
                counts[r] += 1
        common = sorted(r for r, n in counts.items() if n == len(slow))
        hosts = {r.rank: r.host for r in ctx.report.ranks}
        where = (f"ranks {ranges(common)} (host {', '.join(sorted({hosts.get(r) or '?' for r in common}))}) "
                 "are in every slow unit"
                 if common and len({u.unit for u, _ in slow}) > 1 else
                 f"{slow[0][0].unit}: check the link between its ranks")
        evidence = [f"{u.unit} ({u.scope}) {u.kind} {u.size_bucket}: busbw {u.median_busbw_gbps} GB/s vs "
                    f"{round(med, 2)} GB/s median of the other groups ({u.instances} instances)"
                    for u, med in sorted(slow, key=lambda x: (x[0].median_busbw_gbps or 0) / x[1])[:8]]
        evidence.append(where)
        cost = self._cost(ctx, slow)
        win = max(ctx.window_ms().values() or [0.0]) or 1.0
        ranks = sorted({r for u, _ in slow for r in u.ranks})
        return [finding(self.kind, common or ranks, "slow link: transfer bandwidth far below the peers'",
                        evidence, FIX, cost, pct=100 * cost / win)]

    def _cost(self, ctx: Context, slow: list[tuple[CommUnitRow, float]]) -> float:
        """Transfer time beyond what the peers' bandwidth would have needed, on one rank."""
        rows = {(r.kind, r.bucket_bytes, r.scope): r for r in (ctx.report.comm.by_kind if ctx.report.comm else [])}
        cost = 0.0
        for u, med in slow:
            k = rows.get((u.kind, u.bucket_bytes, u.scope))
            if k and k.instances and u.median_busbw_gbps:
                per = k.transfer_ms / k.instances
                cost += per * u.instances / max(1, len(u.ranks)) * (1 - u.median_busbw_gbps / med)
        return cost

    def _link(self, ctx: Context) -> list[Finding]:
        comm = ctx.report.comm
        if comm is None or comm.nominal is None:
            return []
        bad = [k for k in comm.by_kind if k.scope == "intra" and k.bucket_bytes >= self.min_bytes
               and k.pct_of_nominal is not None and k.pct_of_nominal < self.min_nominal_pct]
        if not bad:
            return []
        n = len({r.rank for r in ctx.report.ranks})
        cost = sum(k.transfer_ms for k in bad) / max(1, n)
        win = max(ctx.window_ms().values() or [0.0]) or 1.0
        rate = comm.nominal.gbps_per_direction
        evidence = [f"{k.kind} {k.size_bucket}: busbw {k.median_busbw_gbps} GB/s = {k.pct_of_nominal}% of "
                    f"{rate:g} GB/s ({comm.nominal.link}, {comm.nominal.gpu}); {k.instances} instances"
                    for k in sorted(bad, key=lambda k: k.pct_of_nominal or 0)[:8]]
        evidence.append(f"intra-node messages >= {self.min_bytes >> 20} MiB reach well over "
                        f"{self.min_nominal_pct:g}% of NVLink on a healthy link; this is the speed of a fallback "
                        "transport (sockets or PCIe through the host)")
        return [finding(self.kind, sorted({r.rank for r in ctx.report.ranks}),
                        f"slow link: intra-node bus bandwidth at {max(k.pct_of_nominal or 0 for k in bad)}% or "
                        f"less of NVLink", evidence, FIX, cost, pct=100 * cost / win)]


RULE = SlowLink()
