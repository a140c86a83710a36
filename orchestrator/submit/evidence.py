"""What a job that did not end by itself left in its run directory, read once at collect time so
the store keeps it (a store copied elsewhere still knows how its job ended): the scheduler's
state (`orch status`'s own code), the stack dumps and PyTorch's Flight Recorder dumps, and each
rank's DataLoader settings (store/loaders.py).

The rank hook (templates/sitecustomize.py.j2) writes `dumps/stacks.r<RANK>.txt` and
`dumps/flight_recorder/rank_<RANK>` when orch stops a job; NCCL's watchdog writes the latter
itself when a collective times out. A Flight Recorder dump is a pickle of plain dicts, lists and
strings. A pickle can run code and a run directory is not trusted input, so it is read by an
unpickler that builds nothing but plain types; a dump that needs anything else is skipped. Only
the last collective of each rank and process group is kept: that is what tells the ranks apart,
and it does not grow with the recorder's buffer.

This module reads it into `JobEvidence` (store/evidence.py), which collect writes into the store
and the analysis reads from there alone.
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path
from typing import Any

from orchestrator.errors import OrchError
from orchestrator.runpaths import RunPaths
from orchestrator.store.evidence import ExitHang, JobEvidence, LastCollective, StackClass, StopRecord, TaskEnd
from orchestrator.store.loaders import LOADERS_BYTES, LOADERS_NAME, loaders

MAX_DUMP_BYTES = 256 << 20  # a recorder of 20,000 entries with stacks is a few MiB
MAX_STACK_BYTES = 1 << 20  # the last dumps of a stack file; a rank dumped many times appends
_FR_NAME = re.compile(r"rank_(\d{1,7})")
_STACK_NAME = re.compile(r"stacks\.r(\d{1,7})\.txt")
_EXIT_NAME = re.compile(r"exit_hang\.r(\d{1,7})")
# orch's own threads and frames in a rank's stacks: the hook's, the loop marks'.
_ORCH_FILES = ("/pyhooks/sitecustomize.py", "/pyhooks/orch_loop_marks.py")
_FRAME = re.compile(r'\s*File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<func>.*)')


def gather(run: Path) -> JobEvidence | None:
    """The job's evidence, or None outside an orch run directory (reports alone)."""
    st = job_state(run)
    if st is None:
        return None
    paths = RunPaths(run)
    return JobEvidence(job_id=st["job_id"], executor=st["executor"], state=st["state"],
                       tasks=[TaskEnd.model_validate({**t, "failed_frames": raised_at(t)}) for t in st["tasks"]],
                       stop=StopRecord.model_validate(st["stop"]) if st.get("stop") else None,
                       dumps=dump_files(run), flight_recorder=last_collectives(paths.flight_recorder),
                       flight_diverged=diverged_collectives(paths.flight_recorder), stacks=stacks(paths.dumps),
                       stack_classes=stack_classes(paths.dumps), oom=torch_oom(st["tasks"]),
                       reports_lost=reports_lost(st["tasks"]),
                       loaders=loaders(rank_texts(paths.dumps, LOADERS_NAME, LOADERS_BYTES, tail=False)),
                       exit_hangs=exit_hangs(paths.dumps))


_LOST = re.compile(r"^orch: rank (\d{1,7}): report lost: (.*)$", re.M)


def reports_lost(tasks: list[dict[str, Any]]) -> dict[int, str]:
    """Per rank, why its report was lost, from the rank wrapper's line in its task's log."""
    out: dict[int, str] = {}
    for t in tasks:
        try:
            with open(t.get("stderr") or "", "rb") as fh:
                fh.seek(0, 2)
                fh.seek(max(0, fh.tell() - MAX_STACK_BYTES))
                text = fh.read().decode(errors="replace")
        except OSError:
            continue
        for m in _LOST.finditer(text):
            out.setdefault(int(m.group(1)), m.group(2).split(";")[0])
    return out


# torch's own words when an allocation fails: `torch.OutOfMemoryError: CUDA out of memory. Tried to
# allocate ...` (older: `RuntimeError: CUDA out of memory. ...`), one line, tagged `[rankN]:` by
# torch's excepthook; the advice it ends with is left out.
_OOM_LINE = re.compile(r"^(?:\[rank(\d{1,7})\]: ?)?[\w.]*(?:OutOfMemoryError|RuntimeError): "
                       r"(CUDA out of memory\. Tried to allocate .*?)(?: If reserved but unallocated.*)?$", re.M)


def torch_oom(tasks: list[dict[str, Any]]) -> dict[int, str]:
    """Per rank, torch's out-of-memory message from its task's log: the allocation it tried,
    what the process and PyTorch held, the GPU's capacity and what was free. The events nsys
    keeps show what was allocated; only this says what the failing allocation asked for. A line
    torch did not tag is the task's first failing rank's."""
    out: dict[int, str] = {}
    for t in tasks:
        for m in _OOM_LINE.finditer(_log_tail(t, 4 * MAX_STACK_BYTES)):  # the failure ends the log
            rank = int(m.group(1)) if m.group(1) else t.get("failed_rank")
            if rank is not None:
                out.setdefault(int(rank), m.group(2).strip()[:1000])
    return out


_TB_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+), in (?P<func>.*)$', re.M)


def _log_tail(t: dict[str, Any], most: int) -> str:
    """The last `most` bytes of a task's log (its standard error), "" when unreadable."""
    try:
        with open(t.get("stderr") or "", "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - most))
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


def raised_at(t: dict[str, Any]) -> list[str]:
    """The frames of the task's first failing rank's own Python traceback, innermost first, as
    `file:line (function)`: where the program raised (the report names the line to fix). [] when
    the rank left no traceback (a signal, a native abort)."""
    if t.get("failed_rank") is None:
        return []
    from orchestrator.submit.failure import rank_traceback

    tb = rank_traceback(_log_tail(t, 4 * MAX_STACK_BYTES), 400) or ""
    frames = [f"{m['file']}:{m['line']} ({m['func']})"[:500] for m in _TB_FRAME.finditer(tb)]
    return frames[::-1][:MAX_CLASS_FRAMES]


def job_state(run: Path) -> dict[str, Any] | None:
    """`orch status` of the run `run`, or None when it is not an orch run directory."""
    if not RunPaths(run).manifest.is_file():
        return None
    from orchestrator.submit.core import job_status

    try:
        return job_status(run)
    except (OrchError, OSError):
        return None


def dump_files(run: Path) -> list[str]:
    """The hang evidence files beside the reports, relative to the run directory."""
    d = RunPaths(run).dumps
    if not d.is_dir():
        return []
    return sorted(str(p.relative_to(run)) for p in d.rglob("*") if p.is_file() and p.stat().st_size)


class _PlainUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings, numbers and None: never a class or a callable."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def read_dump(path: Path) -> dict[str, Any] | None:
    """One rank's Flight Recorder dump, or None when it is not a plain Flight Recorder pickle."""
    try:
        if path.stat().st_size > MAX_DUMP_BYTES:
            return None
        data = _PlainUnpickler(io.BytesIO(path.read_bytes())).load()
    except (OSError, pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError,
            AttributeError, RecursionError, MemoryError):
        return None
    return data if isinstance(data, dict) and isinstance(data.get("entries"), list) else None


def _frame(frames: Any) -> str:
    """Where the program called the collective: the innermost frame outside torch itself."""
    if not isinstance(frames, list):
        return ""
    good = [f for f in frames if isinstance(f, dict) and isinstance(f.get("filename"), str)]
    user = [f for f in good if "/torch/" not in f["filename"].replace("\\", "/")]
    f = (user or good or [None])[0]
    return f"{f['filename']}:{f.get('line')} ({f.get('name')})" if f else ""


def _collectives(folder: Path) -> dict[int, dict[str, dict[int, LastCollective]]]:
    """Per rank, per process group, its collectives by sequence number (`rank_<N>` files)."""
    out: dict[int, dict[str, dict[int, LastCollective]]] = {}
    if not folder.is_dir():
        return out
    for p in sorted(folder.iterdir()):
        m = _FR_NAME.fullmatch(p.name)
        dump = read_dump(p) if m and p.is_file() else None
        if dump is None:
            continue
        groups = out.setdefault(int(m.group(1)), {})
        for e in dump["entries"]:
            if not isinstance(e, dict) or e.get("is_p2p") or not isinstance(e.get("collective_seq_id"), int):
                continue
            pg = e.get("process_group")
            key = str(pg[0]) if isinstance(pg, (list, tuple)) and pg else str(e.get("pg_id"))
            desc = str(pg[1]) if isinstance(pg, (list, tuple)) and len(pg) > 1 else ""
            desc = desc if desc and desc != "undefined" else f"process group {key}"  # DDP's group has no name
            groups.setdefault(key, {})[e["collective_seq_id"]] = LastCollective(
                rank=int(m.group(1)), pg=key, pg_desc=desc, seq=e["collective_seq_id"],
                op=str(e.get("profiling_name", "?")), sizes=str(e.get("input_sizes", "")),
                state=str(e.get("state", "")), frame=_frame(e.get("frames")),
                thread=str(e.get("thread_name") or ""),
                created_utc_ns=e["time_created_ns"] if isinstance(e.get("time_created_ns"), int) else None)
    return out


def last_collectives(folder: Path) -> list[LastCollective]:
    """Per rank and process group, the last collective the rank entered."""
    return [by_seq[max(by_seq)] for _, groups in sorted(_collectives(folder).items())
            for _, by_seq in sorted(groups.items()) if by_seq]


def diverged_collectives(folder: Path) -> list[LastCollective]:
    """Each member rank's collective at the first sequence number of a process group where the
    ranks' collectives differ (operation or sizes), among the numbers every member's recorder
    still holds. NCCL can complete such a pair (a one-element all-reduce against a broadcast)
    and go on with every later collective shifted by one on that rank, so the ranks' last
    collectives alone do not show where they parted."""
    by_pg: dict[str, dict[int, dict[int, LastCollective]]] = {}
    for rank, groups in _collectives(folder).items():
        for key, by_seq in groups.items():
            by_pg.setdefault(key, {})[rank] = by_seq
    for _, ranks in sorted(by_pg.items()):
        if len(ranks) < 2:
            continue
        for seq in sorted(set.intersection(*(set(s) for s in ranks.values()))):
            rows = [ranks[r][seq] for r in sorted(ranks)]
            if len({(c.op, _shape(c)) for c in rows}) > 1:
                return rows
    return []


def _shape(c: LastCollective) -> str:
    """The sizes every member passes alike; "" for the collectives whose sizes differ by rank
    (all-to-all splits, the root's list in a gather or scatter)."""
    return "" if any(w in c.op for w in ("to_all", ":gather", ":scatter")) else c.sizes


def _blocks(text: str) -> list[list[re.Match[str]]]:
    """The threads' frames in faulthandler dumps, a block per thread (its run of frame lines,
    whatever its header: `Thread 0x...`, `Current thread 0x...`), innermost first."""
    blocks: list[list[re.Match[str]]] = []
    cur: list[re.Match[str]] = []
    for line in text.splitlines():
        m = _FRAME.fullmatch(line)
        if m:
            cur.append(m)
        elif cur:
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    return blocks


def _main_block(text: str) -> list[re.Match[str]]:
    """The main thread's frames in the last faulthandler dump of a stack file that has it: the
    block whose outermost frame is `<module>`, innermost first; [] without one."""
    main = [b for b in _blocks(text) if b[-1]["func"] == "<module>"]
    return main[-1] if main else []


def main_stack(text: str, frames: int = 6) -> list[str]:
    """The main thread's innermost frames, as `func (folder/file:line)`."""
    return [f"{m['func']} ({'/'.join(Path(m['file']).parts[-2:])}:{m['line']})" for m in _main_block(text)[:frames]]


MAX_CLASS_FRAMES = 64  # faulthandler writes at most 100 frames a thread; the program's own are near the top


def rank_texts(folder: Path, name: re.Pattern[str], most: int, tail: bool) -> dict[int, str]:
    """Per rank the text of its file in `folder` (`name` matches it whole, its group the rank):
    at most `most` bytes, its end (`tail`) or its start."""
    out = {}
    if folder.is_dir():
        for p in sorted(folder.iterdir()):
            m = name.fullmatch(p.name)
            if not m or not p.is_file():
                continue
            try:
                with p.open("rb") as fh:
                    if tail:
                        fh.seek(max(0, p.stat().st_size - most))
                    out[int(m.group(1))] = fh.read(most).decode(errors="replace")
            except OSError:
                continue
    return out


def _stack_texts(folder: Path) -> dict[int, str]:
    """Per rank the tail of its stack file (`stacks.r<RANK>.txt`)."""
    return rank_texts(folder, _STACK_NAME, MAX_STACK_BYTES, tail=True)


def stack_classes(folder: Path) -> list[StackClass]:
    """The ranks grouped by their main thread's whole stack (file, line and function of every
    frame): ranks stuck at the same point fall in one class however many there are, so the
    store keeps a few classes, not a stack a rank. Largest class first."""
    by: dict[tuple[str, ...], list[int]] = {}
    for rank, text in sorted(_stack_texts(folder).items()):
        block = _main_block(text)
        if block:
            key = tuple(f"{m['file']}:{m['line']} ({m['func']})"[:500] for m in block[:MAX_CLASS_FRAMES])
            by.setdefault(key, []).append(rank)
    return [StackClass(ranks=r, frames=list(k)) for k, r in sorted(by.items(), key=lambda kv: (-len(kv[1]), kv[1]))]


def exit_hangs(folder: Path) -> dict[int, ExitHang]:
    """Per rank its wrapper ended after its program finished (`exit_hang.r<RANK>`: the grace and
    how the program finished), with the threads of the dump faulthandler wrote in the meantime
    (the stack file's last, after its `Timeout (...)!` line, and the release's after it): every
    thread but the main one (its stack ends in the interpreter's exit, not in `<module>`) and
    orch's hook."""
    out = {}
    texts = _stack_texts(folder)
    for rank, said in rank_texts(folder, _EXIT_NAME, 256, tail=False).items():
        grace, _, how = said.strip().partition(" ")
        if not grace.isdigit():
            continue
        stack = texts.get(rank, "")
        at = stack.rfind("Timeout (")
        threads: list[list[str]] = []
        for block in _blocks(stack[at:] if at >= 0 else ""):
            frames = [f"{m['file']}:{m['line']} ({m['func']})"[:500] for m in block[:MAX_CLASS_FRAMES]]
            if frames not in threads and block[-1]["func"] not in ("<module>", "_shutdown") \
                    and not any(m["file"].endswith(_ORCH_FILES) for m in block):
                threads.append(frames)  # (the release's own dump, after it, has the same threads)
        out[rank] = ExitHang(grace_s=int(grace), how=how.strip(), threads=threads)
    return out


def stacks(folder: Path) -> dict[int, list[str]]:
    """Per rank its main thread's stack."""
    return {rank: s for rank, text in _stack_texts(folder).items() if (s := main_stack(text))}
