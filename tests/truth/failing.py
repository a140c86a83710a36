"""Truth of the failing jobs: tests/fixtures/faults (real NCCL jobs on H200s, one fault planted
in each by the workload's arguments), tests/fixtures/gloo-hangs (real 4-rank gloo jobs on CPUs,
one rank stuck or calling a collective the others do not), tests/fixtures/exit-hang (a gloo job
whose rank never exited after its last step, nothing planted) and tests/fixtures/exit-ended (a
rank's thread never stopped, which orch ended), READMEs there.

The cause and its rank are the workload's own arguments (the spec in each run's manifest.json),
each checked against a second record the job left: torchrun's "Root Cause" in the job's log for a
rank that raised, ran out of memory or was killed; the Flight Recorder dumps (plain pickle) for a
collective only one rank called; the main-thread stack dumps for a rank stuck in its read. How the
job ended is the scheduler's word (status.txt) and the supervisor's stop record
(submitit/*_stop.json), told apart from a hang by the exports (plain sqlite3): a job is hung when
every rank's loop stood still, long before its capture ended. A failing job has no twin: no saving."""

from __future__ import annotations

import json
import pickle
import re
import sqlite3
import tempfile
from pathlib import Path

from tests.truth import FIXTURES, Truth, levels, opened, peaks, range_ends, range_starts

RESNET = "Step % Start"  # ddp_faults.py's steps
GLOO = "train_step"      # stuck_rank.py's one range a step

# The workload's --fault -> the cause it plants.
FAULT_CAUSE = {"stuck-loader": "hang", "oom": "oom", "sigkill": "kill", "raise": "crash",
               "extra-collective": "divergence"}
# gloo-hangs: stuck_rank.py's option that names the rank -> the cause.
GLOO_CAUSE = {"--stuck-rank": "hang", "--resync-rank": "divergence"}
# The scheduler's word -> orch's outcome (a hang is told from the exports, not by the scheduler).
WORDS = {"COMPLETED": "completed", "FAILED": "failed", "TIMEOUT": "timed out", "CANCELLED": "cancelled"}
# A job hung when every rank's loop had stood still this long before its capture ended: the hangs
# here stood 23-255 s; the failed jobs' rank that failed ended 0.6-2.3 s after its last step began
# and the cancelled healthy loop 0.8-1.1 s.
STILL_S = 10.0
# What a stuck rank's main-thread stack dump holds: waiting for its DataLoader (the worker's read
# blocks), or in stuck_rank.py's read_batch (time.sleep).
STUCK_MARK = {"faults": "_try_get_data", "gloo-hangs": " in read_batch"}

ABOUT = {
    "faults/timeout": "ResNet-50 DDP on 2 H200 (NCCL), rank {root}'s dataset read blocks in step {step}, rank 0 "
                      "waits in DDP's all-reduce; orch stopped the job at the time limit's warning after {after} s",
    "faults/oom": "ResNet-50 DDP on 2 H200 (NCCL), rank {root} gets a 64x batch in step {step}: "
                  "torch.OutOfMemoryError (Tried to allocate 1.53 GiB); torchrun stops rank 1",
    "faults/sigkill": "ResNet-50 DDP on 2 H200 (NCCL), rank {root} is SIGKILLed in step {step} (as the OOM killer "
                      "does, exit 137) and loses its GPU trace; torchrun stops rank 0",
    "faults/watchdog": "ResNet-50 DDP on 2 H200 (NCCL), rank {root}'s dataset read blocks in step {step}; rank 1's "
                       "NCCL watchdog aborts after 25 s, it raises and its exit hangs (its GPU trace lost) until orch "
                       "stopped the job at the time limit's warning after {after} s",
    "faults/raise": "ResNet-50 DDP on 2 H200 (NCCL), rank {root}'s dataset raises ValueError (corrupt JPEG) in a "
                    "DataLoader worker fetching step {step}'s batch; torchrun stops rank 0",
    "faults/extra-collective": "ResNet-50 DDP on 4 H200 (NCCL), rank {root} all-reduces its loss for a log line "
                               "in step {step}, the others do not (Flight Recorder #{seq}); the watchdogs fire, "
                               "ranks stay in backward until orch stopped the job at the time limit's warning after "
                               "{after} s",
    "faults/watchdog-4gpu": "ResNet-50 DDP on 4 H200 (NCCL), rank {root}'s dataset read blocks in step {step}; the "
                            "others' watchdog fires after 25 s, rank 1 raises and exits, ranks 2-3 wait until orch "
                            "stopped the job at the time limit's warning after {after} s (only rank 1's export kept)",
    "faults/cancel": "ResNet-50 DDP on 4 H200 (NCCL), a healthy 2000-step job cancelled with `orch cancel` after "
                     "rank 0 logged step 10; orch's stop after {after} s found the loop running",
    "faults/oom-1gpu": "ResNet-50 on 1 H200, rank {root} gets a 64x batch in step {step}: torch.OutOfMemoryError "
                       "(Tried to allocate 392.00 MiB, 139.46 GiB in use); the job FAILED after 31 s",
    "gloo-hangs/stuck-rank": "4-rank gloo DDP on CPUs, rank {root} blocks in time.sleep in read_batch in step {step}, "
                             "ranks 0-2 wait in backward's all-reduce; orch stopped the job at the time limit's "
                             "warning after {after} s (Flight Recorder off)",
    "gloo-hangs/resync-rank": "4-rank gloo DDP on CPUs, rank {root} re-syncs its weights with dist.broadcast in step "
                              "{step}, which the others never call (Flight Recorder #{seq}); every rank waits until "
                              "orch stopped the job at the time limit's warning after {after} s",
    "gloo-hangs/resync-timeout": "4-rank gloo DDP on CPUs, rank {root} re-syncs its weights with dist.broadcast in "
                                 "step {step}, which the others never call (Flight Recorder #{seq}); every rank waits "
                                 "until gloo's 20 s timeout raises on all of them, torchrun names rank 1: FAILED",
}

HOW = {
    "root": "planted: the workload's {opt} in the spec (manifest.json), as the README says",
    "peak_bytes": "plain sqlite3: CUDA_GPU_MEMORY_USAGE_EVENTS, allocations minus frees on the rank's device "
                  "(tests.truth.peaks), every allocation up to the capture's end",
    "steps": "not judged: a failing job's captures end inside an unfinished step (the ranks' last ones differ "
             "on the NCCL jobs), so no step count is clear",
}


def _has(con: sqlite3.Connection, table: str) -> bool:
    return bool(con.execute("SELECT count(*) FROM sqlite_master WHERE name = ?", (table,)).fetchone()[0])


def _arg(args: list[str], name: str) -> str | None:
    """The value of `name` in an argument list, the last one as argparse takes it."""
    vals = [args[i + 1] for i, a in enumerate(args[:-1]) if a == name]
    return vals[-1] if vals else None


def _log(run: Path, suffix: str) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run / "submitit").glob(f"*_log.{suffix}")))


def _scheduler(run: Path) -> str:
    """The scheduler's word for the job: the first line of status.txt (`orch status` as the job ended)."""
    m = re.match(r"job \d+ \(.*?\): (\w+) \(", (run / "status.txt").read_text())
    if not m:
        raise ValueError(f"{run}: no scheduler state in status.txt")
    return m.group(1)


def _stop(run: Path) -> dict | None:
    """The node supervisor's stop record (why orch stopped the job, after how long), if it stopped it."""
    recs = sorted((run / "submitit").glob("*_stop.json"))
    return json.loads(recs[0].read_text()) if recs else None


def _still_s(con: sqlite3.Connection, like: str) -> float:
    """Seconds from the start of the rank's last step range to the end of its capture (the last event
    end of its NVTX, OS-runtime and CUDA API rows): how long its loop had stood still."""
    ends = [con.execute(f'SELECT max("end") FROM {t}').fetchone()[0]
            for t in ("NVTX_EVENTS", "OSRT_API", "CUPTI_ACTIVITY_KIND_RUNTIME") if _has(con, t)]
    return (max(e for e in ends if e is not None) - range_starts(con, like)[-1]) / 1e9


def _gpu_peaks(cons: dict[int, sqlite3.Connection]) -> dict[int, int] | None:
    """tests.truth.peaks over the ranks whose export holds both GPU memory events and kernels: a rank
    without the table has none to count (sigkill's rank 1), and a rank whose kernels were lost at its
    end (watchdog's rank 1: CUPTI never handed its buffers over) kept only the memory events of its
    first buffer (48 allocations, 0.28 GiB, before its first step), no measure of what it held."""
    have = {r: c for r, c in cons.items() if _has(c, "CUDA_GPU_MEMORY_USAGE_EVENTS")
            and _has(c, "CUPTI_ACTIVITY_KIND_KERNEL")
            and c.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
            and c.execute("SELECT count(*) FROM CUDA_GPU_MEMORY_USAGE_EVENTS "
                          "WHERE memKind IN (2, 3) AND memoryOperationType = 0").fetchone()[0]}
    return peaks(have) if have else None


def _peak_step(con: sqlite3.Connection, like: str) -> int:
    """Which step range (numbered from 0 in time order) holds the time of the rank's highest memory
    level on its device (the level walk of tests.truth.peaks)."""
    top_t = max(levels(con), key=lambda tl: tl[1])[0]  # the first time at the highest level
    starts = range_starts(con, like)
    return max(i for i, s in enumerate(starts) if s <= top_t)


def _torchrun_root(run: Path) -> tuple[int, int]:
    """torchrun's "Root Cause (first observed failure)": (rank, exit code), from the job's log."""
    log = _log(run, "err")
    m = re.search(r"rank\s+: (\d+) \(local_rank: \d+\)\s+exitcode\s+: (-?\d+)",
                  log[log.rindex("Root Cause (first observed failure):"):])
    return int(m.group(1)), int(m.group(2))


def _odd_collective(run: Path) -> tuple[int, list[int]]:
    """The first collective sequence number where the ranks' Flight Recorder entries differ (plain
    pickle over dumps/flight_recorder) and the ranks whose entry there is in the minority."""
    at = {int(p.name.split("_")[1]): {e["collective_seq_id"]: e for e in pickle.loads(p.read_bytes())["entries"]}
          for p in sorted((run / "dumps" / "flight_recorder").glob("rank_*"))}

    def key(r: int, s: int) -> tuple[str, str]:
        return at[r][s]["profiling_name"], str(at[r][s]["input_sizes"])

    seq = min(s for s in set.intersection(*(set(x) for x in at.values())) if len({key(r, s) for r in at}) > 1)
    votes: dict[tuple[str, str], list[int]] = {}
    for r in at:
        votes.setdefault(key(r, seq), []).append(r)
    crowd = max(votes.values(), key=len)
    return seq, sorted(r for r in at if r not in crowd)


def _stuck_in_read(run: Path, family: str) -> list[int]:
    """The ranks whose stack dump (dumps/stacks.r<R>.txt, written at the stop) holds the blocked read."""
    return sorted(int(p.name.split(".")[1][1:]) for p in (run / "dumps").glob("stacks.r*.txt")
                  if STUCK_MARK[family] in p.read_text(errors="replace"))


def _case(name: str, tmp: Path) -> Truth:
    family, _ = name.split("/")
    run = FIXTURES / name
    args = json.loads((run / "manifest.json").read_text())["spec"]["launch"]["args"]
    sched, stop = _scheduler(run), _stop(run)
    like = RESNET if family == "faults" else GLOO
    how: dict[str, str] = {}

    # Cause and root: the planted arguments.
    if family == "faults":
        fault, opt, step_opt = _arg(args, "--fault") or "none", "--fault-rank", "--fault-step"
        cause = FAULT_CAUSE.get(fault)
        if cause is None and stop and stop["reason"] == "cancelled":
            cause = "cancel"  # a healthy job (no fault planted) that a user cancelled: no rank at fault
        how["cause"] = (f"planted: the workload's --fault {fault} (manifest.json's spec)" if cause != "cancel" else
                        "no fault planted (the workload's arguments, manifest.json's spec); orch's stop record "
                        "says cancelled (submitit/*_stop.json)")
    else:
        opt = next(o for o in GLOO_CAUSE if _arg(args, o) is not None)
        cause, step_opt = GLOO_CAUSE[opt], opt.replace("-rank", "-step")
        how["cause"] = f"planted: stuck_rank.py's {opt} (manifest.json's spec; program/stuck_rank.py)"
    if cause is None:
        raise ValueError(f"{name}: no cause planted in {args}")
    root = [] if cause == "cancel" else [int(_arg(args, opt))]
    step = _arg(args, step_opt)
    how["root"] = (HOW["root"].format(opt=opt) if root
                   else "none: no fault planted (the workload's arguments), the job was cancelled healthy")

    # Each root checked against a second record the job left.
    seq = None
    if cause in ("oom", "crash", "kill"):
        first, code = _torchrun_root(run)
        err = {"oom": r"torch\.OutOfMemoryError", "crash": r"ValueError: sample \d+: corrupt JPEG",
               "kill": None}[cause]
        log = _log(run, "err")
        tagged = sorted({int(r) for r in re.findall(rf"^\[rank(\d+)\]: {err}", log, re.M)}) if err else root
        if [first] != root or tagged != root or (cause == "kill") != (code == 137):
            raise ValueError(f"{name}: torchrun names rank {first} (exit {code}), the log tags {tagged}, "
                             f"planted {root}")
        how["root"] += (f"; torchrun's Root Cause in the job's log names rank {first} (exit code {code})"
                        + ("" if cause == "kill" else f", whose own traceback the log tags ({err})"))
    elif cause == "divergence":
        seq, odd = _odd_collective(run)
        if odd != root:
            raise ValueError(f"{name}: the Flight Recorder's odd rank(s) {odd}, planted {root}")
        how["root"] += (f"; the Flight Recorder dumps (plain pickle) first differ at collective #{seq}, "
                        f"where only rank(s) {', '.join(map(str, odd))} called another one")
    elif cause == "hang":
        stuck = _stuck_in_read(run, family)
        if stuck != root:
            raise ValueError(f"{name}: stack dumps show rank(s) {stuck} blocked in the read, planted {root}")
        how["root"] += (f"; of the ranks' stack dumps (dumps/stacks.r*.txt) only its own shows the blocked read "
                        f"({STUCK_MARK[family].strip()})")

    with opened({"run": name}, tmp) as cons:
        still = {r: _still_s(c, like) for r, c in cons.items()}
        hung = min(still.values()) >= STILL_S
        outcome = "hung" if hung else WORDS[sched]
        said = ", ".join(f"rank {r} {s:.1f} s" for r, s in still.items())
        how["outcome"] = (f"the scheduler's word {sched} (status.txt)"
                          + (f", orch's stop record {stop['reason']} ({stop['signal']}) after {stop['after_s']} s "
                             "(submitit/*_stop.json)" if stop else ", no stop record of orch's (submitit/)")
                          + f"; each rank's loop stood still before its capture ended (plain sqlite3: its last "
                          f"{like!r} range's start to its last event): {said}"
                          + (f", every rank over {STILL_S:.0f} s: hung" if hung
                             else f", not every rank over {STILL_S:.0f} s: no hang, the scheduler's word"))
        if hung and sched == "FAILED":
            # No stop of orch's: the job failed on its own, as the waits it hung in timed out.
            waited = sorted({int(r) for r in re.findall(r"^\[rank(\d+)\]: \w+Error: .*Timed out waiting",
                                                        _log(run, "err"), re.M)})
            first, _ = _torchrun_root(run)
            how["outcome"] += (f"; the job's log: rank(s) {', '.join(map(str, waited))} raised a wait's timeout "
                               f"('Timed out waiting'), torchrun's first failure is rank {first}, which only waited: "
                               "a hang that the process group's timeout ended (orch's `hung (FAILED)`)")
        if stop and (stop["reason"], sched) not in (("timeout", "TIMEOUT"), ("cancelled", "CANCELLED")):
            raise ValueError(f"{name}: stop record {stop['reason']} against the scheduler's {sched}")

        peak = _gpu_peaks(cons) if family == "faults" else None
        if peak is not None:
            how["peak_bytes"] = HOW["peak_bytes"] + f", rank(s) {', '.join(map(str, sorted(peak)))}"
            lost = sorted(set(cons) - set(peak))
            if lost:
                how["peak_bytes"] += (f"; rank(s) {', '.join(map(str, lost))} left out: no memory events or no "
                                      "kernels in the export (its GPU trace lost at its end)")
            missing = sorted(set(range(_world(run))) - set(cons))
            if missing:
                how["peak_bytes"] += f"; rank(s) {', '.join(map(str, missing))} have no export here"
        else:
            how["peak_bytes"] = "none: a CPU-only gloo job, no GPU memory events"
        if cause == "oom":
            (r,) = root
            last = len(range_starts(cons[r], like)) - 1
            at = _peak_step(cons[r], like)
            if not (last == at == int(step)):
                raise ValueError(f"{name}: capture ends in step {last}, peak in step {at}, planted {step}")
            how["oom_step"] = (f"{last}: rank {r}'s capture ends in its 'Step {last} Start' range and its highest "
                               f"memory level is in it (plain sqlite3), the planted --fault-step {step}")
    how["steps"] = HOW["steps"]
    fmt = {"root": ", ".join(map(str, root)), "step": step, "seq": seq, "after": stop and stop["after_s"]}
    return Truth(case=f"{family}-{name.split('/')[1]}", about=ABOUT[name].format(**fmt), input={"run": name},
                 cause=cause, root=root, outcome=outcome, steps=None, peak_bytes=peak, how=how)


def _world(run: Path) -> int:
    return int(json.loads((run / "manifest.json").read_text())["world_size"])


def _ran_on(name: str, tmp: Path, like: str) -> dict[int, float]:
    """Per rank, seconds from the end of its last step range to the end of its last OS-runtime
    call (plain sqlite3): how long its process went on after its loop."""
    with opened({"run": name}, tmp) as cons:
        return {r: (con.execute('SELECT max("end") FROM OSRT_API').fetchone()[0] - range_ends(con, like)[-1]) / 1e9
                for r, con in cons.items()}


def _exit_hang(tmp: Path) -> Truth:
    """tests/fixtures/exit-hang: nothing planted. Every rank printed the program's last line (the
    job's log); the ranks whose OS-runtime calls went on more than STILL_S after the end of their
    last step range (plain sqlite3) never exited: the root. orch's stop record says the time limit
    ended the job, the ranks' last steps are complete: hung after the loop."""
    name = "exit-hang"
    run = FIXTURES / name
    stop = _stop(run)
    done = sorted({int(r) for r in re.findall(r"^rank (\d+) stage \d+ done", _log(run, "out"), re.M)})
    after = _ran_on(name, tmp, "step %")
    root = sorted(r for r, s in after.items() if s > STILL_S)
    if done != sorted(after) or not root or stop is None or stop["reason"] != "timeout":
        raise ValueError(f"{name}: printed done {done}, ran on {after}, stop {stop}")
    said = ", ".join(f"rank {r} {s:.1f} s" for r, s in after.items())
    how = {"cause": "nothing planted: every rank printed the program's last line (the job's log), then the job "
                    "ran to its time limit (orch's stop record, submitit/*_stop.json)",
           "root": f"plain sqlite3: each rank's last OS-runtime call after the end of its last 'step N' range: "
                   f"{said}; over {STILL_S:.0f} s: the rank(s) that never exited",
           "outcome": f"orch's stop record {stop['reason']} ({stop['signal']}) after {stop['after_s']} s, every "
                      "step range closed, a rank's calls going on to the stop: hung after the loop",
           "peak_bytes": "none: a CPU-only gloo job, no GPU memory events", "steps": HOW["steps"]}
    return Truth(case=name, about=f"2-rank gloo job of train.py on CPUs: both ranks finished their 6 steps, rank(s) "
                 f"{', '.join(map(str, root))} never exited, until orch stopped the job at the time limit's warning "
                 f"after {stop['after_s']} s", input={"run": name}, cause="hang", root=root, outcome="hung",
                 steps=None, peak_bytes=None, how=how)


# A program of these jobs ends within this long of its loop (exit-hang's rank 1: 0.6 s).
EXIT_S = 5.0


def _exit_ended(tmp: Path) -> Truth:
    """tests/fixtures/exit-ended: the planted rank (stuck_rank.py's --uploader-rank) starts a thread
    it never stops; its OS-runtime calls go on more than EXIT_S after its last step range (plain
    sqlite3), the others' do not. No stop of orch's; the scheduler's word is the outcome."""
    name = "exit-ended"
    run = FIXTURES / name
    args = json.loads((run / "manifest.json").read_text())["spec"]["launch"]["args"]
    planted = [int(_arg(args, "--uploader-rank"))]
    after = _ran_on(name, tmp, GLOO)
    late = sorted(r for r, s in after.items() if s > EXIT_S)
    sched = _scheduler(run)
    if late != planted or _stop(run) is not None or sched != "COMPLETED":
        raise ValueError(f"{name}: planted {planted}, ran on {after}, {sched}")
    said = ", ".join(f"rank {r} {s:.1f} s" for r, s in after.items())
    how = {"cause": "planted: stuck_rank.py's --uploader-rank (manifest.json's spec; program/stuck_rank.py): a "
                    "thread never stopped, which the interpreter waits for at exit",
           "root": f"planted: the workload's --uploader-rank in the spec; plain sqlite3: each rank's last OS-runtime "
                   f"call after the end of its last 'train_step' range: {said}; over {EXIT_S:.0f} s: {late}",
           "outcome": f"the scheduler's word {sched} (status.txt), no stop record of orch's (submitit/)",
           "peak_bytes": "none: a CPU-only gloo job, no GPU memory events", "steps": HOW["steps"]}
    return Truth(case=name, about=f"2-rank gloo DDP on CPUs, rank {planted[0]} hands its losses to a thread it never "
                 "stops: its process does not end after its 20 steps; the job completed", input={"run": name},
                 cause="hang", root=planted, outcome="completed", steps=None, peak_bytes=None, how=how)


def cases() -> list[Truth]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ABOUT:
            d = Path(tmp) / name.replace("/", "-")
            d.mkdir()
            out.append(_case(name, d))
            for f in d.iterdir():  # the decompressed exports of one job at a time
                f.unlink()
        out += [_exit_hang(Path(tmp)), _exit_ended(Path(tmp))]
    return out
