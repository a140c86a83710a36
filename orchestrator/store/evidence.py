"""How a job run under orch ended, as the store keeps it: `JobEvidence`, one typed model that
collect writes into the store (meta key `job`, its JSON) from what the job left in its run
directory (submit/evidence.py reads it), and the analysis reads from the store alone, so a store
copied elsewhere reads the same. A new kind of evidence is a field here and its reader there."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, ValidationError

from orchestrator.store.loaders import LoaderSettings


class _Kept(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)  # a newer orch's store: its extra fields are skipped


class LastCollective(_Kept):
    """A rank's last collective in one process group, from its Flight Recorder dump."""

    rank: int
    pg: str
    pg_desc: str
    seq: int
    op: str
    sizes: str = ""
    state: str = ""
    frame: str = ""  # where the program called it (file:line (function)), "" without a Python stack
    thread: str = ""  # the thread that issued it (DDP's gradient all-reduce: the autograd thread)
    created_utc_ns: int | None = None  # when the rank called it (the recorder's time_created_ns, UTC)


class TaskEnd(_Kept):
    """How one task (a node's launch) ended, as `orch status` read it from submitit's files."""

    task: int
    result: str
    error: str = ""
    failed_rank: int | None = None  # the task's first failing rank, by torchrun's log
    failed_exit: str | None = None  # how it ended, in words
    failed_by_peer: bool = False  # its own error only says it lost a peer
    failed_at: str | None = None
    # its own Python traceback's frames, innermost first, `file:line (function)` (where it raised)
    failed_frames: list[str] = []


class StopRecord(_Kept):
    """Why and when orch stopped the job (submitit/<job>_<node>_stop.json)."""

    reason: str | None = None  # timeout, cancelled, step_ended
    signal: str | None = None
    after_s: float | None = None
    at_utc_ns: int | None = None  # when the stop began (UTC): the ranks' progress is judged up to it


class StackClass(_Kept):
    """Ranks whose main thread had the same Python stack when it was dumped (an equivalence
    class of the ranks' stacks, as LLNL's Stack Trace Analysis Tool merges them)."""

    ranks: list[int]
    frames: list[str]  # innermost first, each `file:line (function)` with the file's whole path


class ExitHang(_Kept):
    """A rank whose program finished but whose process did not end, which its wrapper ended after
    profile.exit_grace_s (dumps/exit_hang.r<RANK>), with its threads' stacks halfway there."""

    grace_s: int
    how: str = ""  # how the program finished: ok, or exception (an uncaught one ended it)
    # each thread other than the main one and orch's hook, then: its frames, innermost first,
    # `file:line (function)` with the file's whole path
    threads: list[list[str]] = []


class JobEvidence(_Kept):
    """What a job run under orch left about how it ended, read once at collect time."""

    job_id: str
    executor: str
    state: str  # the scheduler's word: COMPLETED, FAILED, TIMEOUT, CANCELLED, ...
    tasks: list[TaskEnd] = []
    stop: StopRecord | None = None
    dumps: list[str] = []
    flight_recorder: list[LastCollective] = []
    flight_diverged: list[LastCollective] = []  # each rank's collective where the ranks' first differ
    stacks: dict[int, list[str]] = {}
    stack_classes: list[StackClass] = []  # the ranks grouped by their main thread's whole stack
    oom: dict[int, str] = {}  # rank -> torch's out-of-memory message, whole (what it asked, what it held)
    reports_lost: dict[int, str] = {}  # rank -> why its report was lost, in the rank wrapper's words
    loaders: dict[int, list[LoaderSettings]] = {}  # rank -> its DataLoaders' settings (orch's loop marks)
    exit_hangs: dict[int, ExitHang] = {}  # rank -> its program finished and its process was ended

    @property
    def ended_early(self) -> bool:
        return self.state not in ("COMPLETED", "RUNNING", "PENDING", "UNKNOWN")

    def end_only(self) -> str:
        """How the job ended and nothing else, as a store keeps it (meta `job`): what a map's
        one-rank store needs to cut the step its rank was stopped in, as the job's store does
        (collect/summarize.py), without every rank's stacks and dumps in each map task."""
        return JobEvidence(job_id=self.job_id, executor=self.executor, state=self.state).model_dump_json()

    @classmethod
    def from_store(cls, text: str | None) -> JobEvidence | None:
        """The evidence a store keeps, or None (a store of reports alone, or unreadable)."""
        try:
            return cls.model_validate_json(text) if text else None
        except ValidationError:
            return None
