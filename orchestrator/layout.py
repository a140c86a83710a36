"""The parallel layout (tp, pp, dp): one model for the job spec, `--layout`, the manifest and collect.

Megatron order: tp fastest, then dp, then pp, so `stage = rank // (tp*dp)`. `--layout` also
takes cp (context parallel: between tp and dp, so `stage = rank // (tp*cp*dp)`), ep (expert
parallel: carved out of the data-parallel ranks, no extra ranks) and vpp (virtual pipeline
stages per rank: no extra ranks). The data-parallel index of a rank is its place in the
stage's dp*cp group, the ranks Megatron reduces gradients over; what orch cannot analyse per
cp, ep or vpp group the report says (70_stages.sql `layout_notes`). A layout may be
*partial* (`pp=2` alone): the missing dp follows from the world size, which the spec knows
up front and `orch collect --from` only learns from the ranks it finds. Either way it is
filled in by `resolve`, and where it cannot be (tp*pp does not divide the world size) the
user gets one line naming the flag and the fix; stages are never dropped silently.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.errors import OrchError

Dim = Annotated[int, Field(ge=1, le=65536, strict=True)]
KEYS = ("tp", "pp", "dp", "vpp", "microbatches")  # the job spec's keys
CLI_KEYS = (*KEYS, "cp", "ep")  # --layout's


class Layout(BaseModel):
    """Enough of the job's shape to place ranks on nodes and stages.

    `tp`, `pp`, `dp` are what a user writes (job spec `layout:` or `--layout`); `world_size`,
    `nproc_per_node` and `known` are filled by orch. `known` is False when no layout was
    given at all: then stage/dp/tp indices stay empty instead of pretending pp=1.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    tp: Dim = 1
    pp: Dim = 1
    dp: Dim | None = None
    cp: Dim = 1
    ep: Dim = 1
    vpp: Dim = 1
    # The pipeline schedule's microbatches per step: with pp and vpp it gives the schedule's own
    # bubble, (pp-1)/(vpp*microbatches+pp-1), so the report splits the bubble without a flag.
    microbatches: Dim | None = None
    world_size: int | None = Field(default=None, ge=1)
    nproc_per_node: int | None = Field(default=None, ge=1)
    known: bool = False

    @classmethod
    def parse(cls, text: str | None, *, world_size: int | None = None, flag: str = "--layout") -> Layout:
        """`tp=1,pp=2,dp=4` (any subset) -> Layout. With `world_size` the missing dp is
        inferred now; without it the partial values are kept for `resolve` (collect)."""
        if not text or not text.strip():
            return cls() if world_size is None else cls(world_size=world_size)
        vals: dict[str, int] = {}
        for part in text.split(","):
            key, _, value = part.partition("=")
            key, value = key.strip(), value.strip()
            if key not in CLI_KEYS or not value.isascii() or not value.isdigit() \
                    or not 1 <= int(value) <= 65536 or key in vals:
                raise OrchError(f"{flag} {text!r}: use e.g. {flag} tp=1,pp=2,dp=4 (each of tp, pp, dp, cp, ep, "
                                "vpp, microbatches at most once, positive integers; dp may be left out)")
            vals[key] = int(value)
        lay = cls(**vals, known=True)
        if lay.pipeline_only():
            raise OrchError(f"{flag} {text!r}: {lay.pipeline_only()} needs a pipeline (pp >= 2); drop it or give pp")
        if "dp" in vals:
            if (lay.cp * lay.dp) % lay.ep:
                raise OrchError(f"{flag} {text!r}: ep={lay.ep} must divide dp*cp = {lay.cp * lay.dp} (expert-parallel "
                                "groups are made of data-parallel ranks); fix ep or dp")
            lay = lay.model_copy(update={"world_size": lay.tp * lay.cp * lay.pp * lay.dp})
        return lay if world_size is None else lay.resolve(world_size, exact=True, source=flag)

    @classmethod
    def from_spec(cls, data: Any) -> Layout:
        """The job spec's `layout:` mapping; only tp, pp, dp may appear there."""
        if isinstance(data, Layout):
            return data
        if not isinstance(data, dict):
            raise ValueError("must be a mapping such as {tp: 1, pp: 2, dp: 4}")
        extra = sorted(str(k) for k in data if k not in KEYS)
        if extra:
            raise ValueError(f"unknown key {extra[0]!r}; use tp, pp, dp, vpp and microbatches")
        try:
            lay = cls(**data, known=bool(data))
        except ValidationError as e:
            err = e.errors()[0]
            raise ValueError(f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        if lay.pipeline_only():
            raise ValueError(f"{lay.pipeline_only()} needs a pipeline (pp >= 2): drop it or set layout.pp")
        return lay

    def pipeline_only(self) -> str:
        """`vpp=V` or `microbatches=M` where they are given without a pipeline, else ""."""
        if self.pp >= 2:
            return ""
        return f"vpp={self.vpp}" if self.vpp > 1 else f"microbatches={self.microbatches}" \
            if self.microbatches is not None else ""

    def resolve(self, world_size: int, *, exact: bool = False, source: str = "layout",
                nproc_per_node: int | None = None) -> Layout:
        """Fill dp from the world size. `exact`: the world size is certain (spec, CLI with a
        known job) so a full tp*pp*dp must match it; otherwise (ranks found by collect, some
        may be missing) a given dp wins."""
        upd: dict[str, Any] = {}
        if nproc_per_node is not None:
            upd["nproc_per_node"] = nproc_per_node
        if not self.known:
            return self.model_copy(update=upd) if upd else self
        tp_pp = self.tp * self.cp * self.pp  # the ranks of one data-parallel replica
        if (self.dp is None or exact) and world_size % tp_pp:
            fix = ("fix layout or nodes/nproc_per_node" if source == "layout" else
                   f"give dp explicitly, e.g. {source} tp={self.tp},pp={self.pp},dp=N")
            raise OrchError(f"{source}: {self._mp_name()} = {tp_pp} does not divide the world size {world_size}; {fix}")
        if self.dp is None:
            upd.update(dp=world_size // tp_pp, world_size=world_size)
        elif exact:
            if tp_pp * self.dp != world_size:
                fix = ("fix layout.dp or drop it to derive it" if source == "layout"
                       else f"fix dp in {source} or drop it")
                raise OrchError(f"{source}: {self._mp_name()}*dp = {tp_pp * self.dp} but the world size is "
                                f"{world_size}; {fix}")
            upd["world_size"] = world_size
        return self.model_copy(update=upd) if upd else self

    def _mp_name(self) -> str:
        return "tp*cp*pp" if self.cp > 1 else "tp*pp"

    @property
    def stage_size(self) -> int | None:
        """Ranks per pipeline stage (tp*cp*dp), None while dp is unknown."""
        dp = self._dp()
        return self.tp * self.cp * dp if dp else None

    def _dp(self) -> int | None:
        return self.dp or (self.world_size // (self.tp * self.cp * self.pp) if self.world_size else None)

    def place(self, rank: int) -> dict[str, int | None]:
        """Node, stage, dp and tp index of a global rank (None where the layout cannot say)."""
        dp = self._dp()
        return {
            "node": rank // self.nproc_per_node if self.nproc_per_node else None,
            "stage": rank // (self.tp * self.cp * dp) if (self.known and dp) else None,
            "dp_index": (rank // self.tp) % (self.cp * dp) if (self.known and dp) else None,
            "tp_index": rank % self.tp if self.known else None,
        }

    def meta(self) -> dict[str, Any]:
        """The store's `meta.layout` / the manifest's `layout` (keys read by analysis)."""
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "cp": self.cp, "ep": self.ep, "vpp": self.vpp,
                "microbatches": self.microbatches, "known": self.known, "world_size": self.world_size,
                "nproc_per_node": self.nproc_per_node}

    def describe(self) -> str:
        more = "".join(f" {k}={getattr(self, k)}" for k in ("cp", "ep", "vpp") if getattr(self, k) > 1)
        return f"tp={self.tp} pp={self.pp} dp={self.dp}{more}"
