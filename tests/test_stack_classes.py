"""The ranks' main-thread stacks as evidence of a hang: grouped into classes of identical stacks
(as LLNL's Stack Trace Analysis Tool merges them), where most ranks wait in one collective and a
few are elsewhere, the few are the root, named with the line of their own code.

The real capture (tests/fixtures/gloo-hangs/stuck-rank, README there): a 4-rank gloo DDP job
through `orch submit` on this machine, its Flight Recorder off (`TORCH_FR_BUFFER_SIZE=0`), one
NVTX range a step and nothing inside it; rank 3 blocks in `time.sleep` in its data read in step
5 while ranks 0-2 wait in DDP's all-reduce inside backward; orch stopped it at the time limit. The NVTX ranges
cannot tell the ranks apart (every rank in `train_step`) and the recorder is empty; the truth is
the program's own source (the copy kept beside the capture) and plain pickle over the dumps."""

from __future__ import annotations

import json
import lzma
import pickle
import shutil
from pathlib import Path

import pytest

from orchestrator.analyze import stacks
from orchestrator.analyze.model_outcome import StackClassOut
from orchestrator.store.evidence import StackClass
from tests.conftest import REPO, run_orch

FIXTURE = REPO / "tests" / "fixtures" / "gloo-hangs" / "stuck-rank"


def copy_xz_run(src: Path, dest: Path) -> Path:
    """The fixture run copied as a user would after moving it, its xz-compressed exports unpacked."""
    shutil.copytree(src, dest)
    for xz in (dest / "exports").glob("*.sqlite.xz"):
        xz.with_suffix("").write_bytes(lzma.decompress(xz.read_bytes()))
        xz.unlink()
    return dest


def line_of(source: Path, text: str) -> int:
    """The 1-based line of `source` that holds `text` (exactly one)."""
    (n,) = [i for i, ln in enumerate(source.read_text().splitlines(), 1) if text in ln]
    return n


@pytest.fixture(scope="module")
def stuck(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str, str]:
    """The capture collected and reported: (run, report JSON, terminal text, HTML)."""
    run = copy_xz_run(FIXTURE, tmp_path_factory.mktemp("stuck") / "run")
    c = run_orch("collect", str(run))
    assert c.returncode == 0, c.stderr
    r = run_orch("report", str(run), "--json", str(run / "r.json"), "--html", str(run / "r.html"), "--wide")
    assert r.returncode == 0, r.stderr
    return run, json.loads((run / "r.json").read_text()), r.stdout, (run / "r.html").read_text()


@pytest.mark.replay
def test_the_rank_elsewhere_while_the_others_wait_is_the_root_with_its_line(stuck) -> None:
    run, rep, text, html = stuck
    script = json.loads((run / "manifest.json").read_text())["spec"]["launch"]["script"]
    source = FIXTURE / "program" / Path(script).name
    sleep = line_of(source, "time.sleep(a.stuck_s)")
    backward = line_of(source, "loss.backward()")
    # Neither the recorder nor the trace tells the ranks apart: every dump is empty (plain
    # pickle), every rank's capture ends inside the same `train_step` range.
    dumps = sorted((run / "dumps" / "flight_recorder").glob("rank_*"))
    assert len(dumps) == 4 and all(pickle.loads(p.read_bytes())["entries"] == [] for p in dumps)
    o = rep["outcome"]
    assert {r["rank"]: r["open_ranges"] for r in o["ranks"]} == {r: ["train_step"] for r in range(4)}
    assert o["flight_recorder"] == []
    # The stacks do.
    assert (o["state"], o["scheduler_state"], o["behind"]) == ("hung", "TIMEOUT", [3]), o["line"]
    assert (o["root_from"], o["root_frame"]) == ("stacks", f"{script}:{sleep} (read_batch)")
    classes = [(c["count"], c["ranks"], c["frame"], c["waits"].split(" ")[0], c["root"]) for c in o["stack_classes"]]
    assert classes == [(3, [0, 1, 2], f"{script}:{backward} (train_step)", "backward", False),
                       (1, [3], f"{script}:{sleep} (read_batch)", "", True)]
    assert o["line"].startswith("hung (TIMEOUT): rank(s) 3 never reached the point where the others waited")
    assert f"rank(s) 3 at {script}:{sleep} (read_batch), while rank(s) 0-2 waited in backward" in o["line"]
    # The top finding points at that line, never at the time limit.
    top = rep["findings"][0]
    assert (top["kind"], top["ranks"], top["victims"]) == ("job_outcome", [3], [0, 1, 2])
    assert top["fix"].startswith("Rank 3 is the root")
    assert f"fix what its code does at {script}:{sleep} (read_batch)" in top["fix"]
    assert "slurm.time" not in top["fix"]
    # Shown as classes: the terminal's line, and the HTML's table (count, ranks, frame).
    assert (f"main-thread stacks: 3 rank(s) 0-2 waiting in backward (DDP's gradient all-reduce waits there) at "
            f"{script}:{backward} (train_step); 1 rank(s) 3 at {script}:{sleep} (read_batch) (the root)") in text
    assert 'id="stack-classes"' in html
    assert f"<td>3</td><td>0-2</td><td>{script}:{backward} (train_step)</td>" in html
    assert f'<tr class="sev-high"><td>1</td><td>3</td><td>{script}:{sleep} (read_batch)</td>' in html


def _cls(ranks: list[int], *frames: str) -> StackClass:
    return StackClass(ranks=ranks, frames=list(frames))


_ALLREDUCE = ("/v/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py:2806 (all_reduce)",
              "/v/lib/python3.12/site-packages/torch/distributed/c10d_logger.py:81 (wrapper)",
              "/w/train.py:52 (step)", "/w/train.py:90 (main)", "/w/train.py:99 (<module>)")
_BROADCAST = ("/v/lib/python3.12/site-packages/torch/distributed/distributed_c10d.py:2700 (broadcast)",
              "/w/train.py:50 (step)", "/w/train.py:90 (main)", "/w/train.py:99 (<module>)")
_LOADER = ("/usr/lib/python3.12/threading.py:359 (wait)", "/usr/lib/python3.12/queue.py:180 (get)",
           "/v/lib/python3.12/site-packages/torch/utils/data/dataloader.py:1310 (_try_get_data)",
           "/w/train.py:44 (step)", "/w/train.py:90 (main)", "/w/train.py:99 (<module>)")


@pytest.mark.fast
def test_classes_name_the_programs_frame_and_what_they_wait_in() -> None:
    out = stacks.classes([_cls([0, 1, 2], *_ALLREDUCE), _cls([3], *_LOADER)])
    assert [(c.count, c.frame, c.waits, c.innermost) for c in out] == [
        (3, "/w/train.py:52 (step)", "torch.distributed all_reduce",
         "distributed/distributed_c10d.py:2806 (all_reduce)"),
        (1, "/w/train.py:44 (step)", "", "python3.12/threading.py:359 (wait)")]
    assert stacks.root(out) == [3]


@pytest.mark.fast
@pytest.mark.parametrize(("kept", "root"), [
    # most wait in one collective, one rank calls another: the one is the root
    ([_cls([0, 1, 2], *_ALLREDUCE), _cls([3], *_BROADCAST)], [3]),
    # two ranks: one waits, the other is elsewhere
    ([_cls([0], *_ALLREDUCE), _cls([1], *_LOADER)], [1]),
    # two ranks, each in a different collective: nothing tells which is odd
    ([_cls([0], *_ALLREDUCE), _cls([1], *_BROADCAST)], []),
    # one class: every rank at the same point (a cancel of a running loop, a hang whose root left no stack)
    ([_cls([0, 1, 2, 3], *_ALLREDUCE)], []),
    # most ranks elsewhere and not waiting: no crowd waits for them
    ([_cls([0], *_ALLREDUCE), _cls([1, 2, 3], *_LOADER)], []),
    # nobody waits in a collective or sync
    ([_cls([0, 1], *_LOADER), _cls([2], "/w/train.py:70 (save)", "/w/train.py:99 (<module>)")], []),
])
def test_the_few_elsewhere_are_the_root_only_where_most_wait_at_one_point(kept: list[StackClass],
                                                                          root: list[int]) -> None:
    assert stacks.root(stacks.classes(kept)) == root


@pytest.mark.fast
def test_the_line_marks_the_root() -> None:
    out = stacks.mark(stacks.classes([_cls([0, 1, 2], *_ALLREDUCE), _cls([3], *_LOADER)]), [3])
    assert [c.root for c in out] == [False, True]
    assert stacks.line(out) == ("main-thread stacks: 3 rank(s) 0-2 waiting in torch.distributed all_reduce at "
                                "/w/train.py:52 (step); 1 rank(s) 3 in python3.12/threading.py:359 (wait) at "
                                "/w/train.py:44 (step) (the root)")
    assert stacks.line([StackClassOut(count=2, ranks=[0, 1], frame="/w/train.py:52 (step)")]) == ""
