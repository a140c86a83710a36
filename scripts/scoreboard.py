#!/usr/bin/env python3
"""The scoreboard: orch over every real capture in tests/fixtures, judged against its truth file
(tests/fixtures/truth/<case>.json, computed without orch by `python -m tests.truth`).

For each case it runs what a user runs (`orch collect`, `orch report --json`) in a scratch copy and
prints one row: the truth (cause, root, what the fix saves), orch's top finding (kind, ranks,
saving), the replay's error, and hit or miss with what missed. A change to the analysis is judged
on the whole board, never on the case at hand.

    python scripts/scoreboard.py                      # the table, in the terminal
    python scripts/scoreboard.py --markdown docs/scoreboard.md --json board.json
    python scripts/scoreboard.py --case pairs-gpu-straggler --keep /tmp/sb
    python scripts/scoreboard.py --reports /tmp/sb     # judged again from the kept reports
    python scripts/scoreboard.py --after-job --keep /tmp/sbj   # collected as after a job (below)

A row is a hit when every judged part holds: the job's outcome; the cause and the root (the top
finding above `info` names the cause, on exactly the root's ranks; a healthy run has nothing above
`info`; no other finding blames a rank outside the root above `low`); the saving within
±20 % of the measured one (and, where the truth measured it without the profiler too and the
finding estimates it, that estimate within ±20 % of it); the step count; each rank's GPU memory
peak within 0.1 %. Exit status 0 whatever the verdicts (tests/test_scoreboard.py holds the known
misses); 2 when orch itself failed.

--after-job collects each case as after a job whose ranks were mapped there (`orch collect --parts
--map-stats`: each rank's per-rank analysis made by its map, and the report taking it): both
routes give the same report, and a --keep of each can be compared report by report.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
TRUTH = FIXTURES / "truth"
SAVING_TOLERANCE = 0.20
PEAK_TOLERANCE = 0.001
REPLAY_ERROR_PCT = 5.0  # the most the unchanged replay may miss a completed job's measured steps by
# Findings that blame a rank for lost time: another such finding on a rank outside the root, above
# `low`, names a victim as a cause.
BLAMING = {"straggler", "stage_imbalance", "data_loader_stall", "cpu_phase_outlier", "pipeline_bubble",
            "unprofiled_straggler"}
INPUT_WORDS = re.compile(r"data ?load|loader|input|batch|next\(|__next__|num_workers", re.I)
FAILED = {"hang", "crash", "oom", "kill", "divergence"}
MEMORY = {"memory-growth"}


def _names(f: dict, cause: str) -> bool:
    """Does finding `f` name `cause`? By its kind and, where a kind serves several causes (a
    straggler may be slow on its GPU, its CPU or its input), by what its title and fix say."""
    kind, text = f["kind"], f"{f['title']} {f['fix']}"
    if cause == "gpu-compute":
        return kind == "straggler" and "GPU comput" in f["title"]
    if cause == "cpu":
        return kind in {"straggler", "cpu_phase_outlier", "cpu_gap"} and "GPU comput" not in f["title"] \
            and not INPUT_WORDS.search(f["title"])
    if cause == "graph-shapes":  # CUDA graphs recorded again for new input shapes, said so
        return kind == "cuda_graphs" and "shape" in f["title"]
    if cause == "input":
        return kind == "data_loader_stall" or (kind in {"straggler", "cpu_phase_outlier", "cpu_gap"}
                                              and bool(INPUT_WORDS.search(text)))
    return kind in {
        "stage": {"stage_imbalance"},
        "host-sync": {"host_sync", "sync_memcpy", "sync_memset"},
        "launch": {"launch_bound"},
        "pageable-copy": {"pageable_memcpy"},
        "allocator-churn": {"allocator_churn"},
        "memory-growth": {"memory_growth"},
        "slow-link": {"slow_link"},
    }.get(cause, set())


@dataclass
class Row:
    case: str
    about: str
    truth: str
    orch: str
    saving: str
    replay_error: str
    verdict: str = "hit"
    missed: list[str] = field(default_factory=list)
    seconds: float = 0.0


def _unpack(src: Path, dest: Path) -> Path:
    """A compressed export decompressed into `dest` (orch reads .sqlite.gz itself; .xz it does not)."""
    if src.suffix != ".xz":
        return src
    out = dest / src.name[:-3]
    with lzma.open(src, "rb") as fi, open(out, "wb") as fo:
        shutil.copyfileobj(fi, fo)
    return out


def _orch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], text=True, capture_output=True,
                          check=False, cwd=REPO, env={**os.environ, "NO_COLOR": "1"})


def report_of(truth: dict, work: Path, after_job: bool = False) -> dict:
    """orch's report JSON for one case, made as a user makes it, in `work` (also report.json, and
    report.txt: the terminal's text); `after_job`: collected over parts with the map's statistics."""
    spec = truth["input"]
    if "run" in spec:
        run = work / "run"
        shutil.copytree(FIXTURES / spec["run"], run)
        for f in list((run / "exports").glob("*.sqlite.*")):
            if f.suffix == ".gz":
                with gzip.open(f, "rb") as fi, open(f.with_suffix(""), "wb") as fo:
                    shutil.copyfileobj(fi, fo)
                f.unlink()
            elif f.suffix == ".xz":
                _unpack(f, f.parent)
                f.unlink()
        steps = [("collect", str(run))]
    else:
        (work / "in").mkdir()
        files = [str(_unpack(FIXTURES / f, work / "in")) for f in spec["exports"]]
        run = work / "run"
        layout = ["--layout", spec["layout"]] if spec.get("layout") else []
        steps = [("collect", "--from", *files, "--out", str(run), *layout)]
    if after_job:
        steps = [(*steps[0], "--parts", "--map-stats")]
    for args in [*steps, ("report", str(run), "--json", str(work / "report.json"), "--wide")]:
        p = _orch(*args)
        if p.returncode != 0:
            raise RuntimeError(f"orch {args[0]} exited {p.returncode}: {(p.stderr or p.stdout).strip()[-400:]}")
    (work / "report.txt").write_text(p.stdout)  # the report as the terminal shows it, every rank
    return json.loads((work / "report.json").read_text())


def _ranks(rs: list[int]) -> str:
    return ",".join(map(str, rs)) if rs else "-"


def _replay_error(rep: dict) -> str:
    """The unchanged replay's error over its steps, or `-` where nothing was replayed (one GPU, a
    CPU job, no NCCL work matched across ranks)."""
    rp = rep.get("replay")
    return f"{rp['error_pct']:.2f} % ({len(rp['steps'])} steps)" if rp else "-"


def judge(truth: dict, rep: dict) -> Row:
    """One row: what the truth says, what orch says, and which judged parts miss."""
    cause, root = truth["cause"], truth["root"]
    findings = rep["findings"]
    loud = [f for f in findings if f["severity"] != "info"]
    top = loud[0] if loud else None
    outcome = (rep.get("outcome") or {}).get("state", "completed")
    row = Row(case=truth["case"], about=truth["about"],
              truth=f"{cause} r{_ranks(root)}" + (f" ({truth['outcome']})" if truth["outcome"] != "completed" else ""),
              orch=f"{top['severity']} {top['kind']} r{_ranks(top['ranks'])}" if top else "nothing above info",
              saving="", replay_error=_replay_error(rep))
    missed = row.missed
    if truth["outcome"] == "completed" and rep.get("replay") and rep["replay"]["error_pct"] > REPLAY_ERROR_PCT:
        missed.append(f"replay error {rep['replay']['error_pct']} % (above {REPLAY_ERROR_PCT} %)")
    if outcome != truth["outcome"]:
        missed.append(f"outcome {outcome}, truth {truth['outcome']}")
    if cause == "none":
        if top:
            missed.append(f"healthy, but {top['severity']} {top['kind']} ({top['cost_ms']:.0f} ms)")
    elif cause == "cancel":
        o = rep.get("outcome") or {}
        first = [] if o.get("failed_first") is None else [o["failed_first"]]
        blamed = sorted({*(o.get("behind") or []), *first})
        if blamed:
            missed.append(f"a cancel blamed on ranks {_ranks(blamed)}")
    elif cause in FAILED:
        named = [f for f in loud if f["kind"] == "job_outcome"]
        got = named[0]["ranks"] if named else []
        if got != root:
            missed.append(f"root r{_ranks(got)}, truth r{_ranks(root)}")
    elif cause in MEMORY:  # a memory finding costs no time: named above `info`, on the root
        named = [f for f in loud if _names(f, cause)]
        if not named or named[0]["ranks"] != root:
            missed.append(f"cause: {cause} on r{_ranks(root)} not named above info")
    else:
        hit = next((f for f in loud if _names(f, cause)), None)
        if top is None or not _names(top, cause):
            where = f", named lower ({hit['severity']} {hit['kind']})" if hit else ", not named"
            missed.append(f"cause: top {row.orch}{where}")
        elif top["ranks"] != root:
            missed.append(f"root r{_ranks(top['ranks'])}, truth r{_ranks(root)}")
        if truth.get("function") and top is not None and f"`{truth['function']}`" not in top["title"]:
            missed.append(f"function: the top finding does not name `{truth['function']}`")
        victims = sorted({r for f in loud if f["kind"] in BLAMING and f["severity"] in ("medium", "high")
                          for r in f["ranks"] if r not in root})
        if victims:
            missed.append(f"victims above low: r{_ranks(victims)}")
        if truth["saving_ms"] is not None:
            got_ms = (hit or {}).get("cost_ms")
            row.saving = f"{truth['saving_ms']:.0f} / " + ("-" if got_ms is None else f"{got_ms:.0f}")
            if got_ms is None or abs(got_ms - truth["saving_ms"]) > SAVING_TOLERANCE * truth["saving_ms"]:
                off = "" if got_ms is None else f" ({100 * (got_ms / truth['saving_ms'] - 1):+.0f} %)"
                missed.append(f"saving {row.saving} ms{off}")
        bare = truth.get("saving_unprofiled_ms")
        if bare is not None and hit is not None and hit.get("unprofiled_ms") is not None:
            # the finding's own estimate without the profiler, against the loops' unprofiled timings
            got = hit["unprofiled_ms"]
            row.saving += f" (unprofiled {bare:.0f} / {got:.0f})"
            if abs(got - bare) > SAVING_TOLERANCE * bare:
                missed.append(f"saving without the profiler {bare:.0f} / {got:.0f} ms "
                              f"({100 * (got / bare - 1):+.0f} %)")
    if truth["steps"] is not None and len(rep["steps"]) != truth["steps"]:
        missed.append(f"steps {len(rep['steps'])}, truth {truth['steps']}")
    if truth["peak_bytes"]:
        mem = {m["rank"]: m["capture_peak_bytes"] for m in (rep.get("memory") or {}).get("ranks", [])}
        off = [r for r, b in truth["peak_bytes"].items()
               if int(r) not in mem or abs(mem[int(r)] - b) > PEAK_TOLERANCE * b]
        if off:
            missed.append(f"memory peak of r{','.join(off)}")
    if missed:
        row.verdict = "miss"
    return row


def _failed(truth: dict, why: str) -> Row:
    return Row(case=truth["case"], about=truth["about"], truth=truth["cause"], orch="orch failed", saving="",
               replay_error="", verdict="error", missed=[why])


def run_case(truth: dict, keep: Path | None, after_job: bool = False) -> Row:
    import time

    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"sb-{truth['case']}-") as tmp:
        work = Path(tmp)
        try:
            row = judge(truth, report_of(truth, work, after_job))
        except RuntimeError as e:
            row = _failed(truth, str(e))
            (work / "error.txt").write_text(str(e))
        if keep:
            shutil.copytree(work, keep / truth["case"], dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.sqlite"))
    row.seconds = round(time.monotonic() - t0, 1)
    return row


def kept_case(truth: dict, kept: Path) -> Row:
    """A case judged from the report a --keep run left in kept/<case> (report.json, or error.txt
    when orch failed there), orch not run again: the verdicts after a change to a truth file or
    to the judging."""
    d = kept / truth["case"]
    if (d / "report.json").is_file():
        return judge(truth, json.loads((d / "report.json").read_text()))
    if (d / "error.txt").is_file():
        return _failed(truth, (d / "error.txt").read_text())
    raise SystemExit(f"scoreboard: no report.json for {truth['case']} in {d}: make it with --keep {kept}")


def truths(cases: list[str]) -> list[dict]:
    files = sorted(TRUTH.glob("*.json"))
    out = [json.loads(f.read_text()) for f in files]
    if cases:
        unknown = set(cases) - {t["case"] for t in out}
        if unknown:
            raise SystemExit(f"scoreboard: no truth file for {', '.join(sorted(unknown))} in {TRUTH}; "
                             "`python -m tests.truth` writes them")
        out = [t for t in out if t["case"] in cases]
    return out


def markdown(rows: list[Row], known: dict[str, str]) -> str:
    hits = sum(r.verdict == "hit" for r in rows)
    lines = [
        "# The scoreboard: orch on every real capture",
        "",
        "Generated by `python scripts/scoreboard.py --markdown docs/scoreboard.md`; do not edit by hand. Each row is",
        "one real capture in tests/fixtures, judged against its truth file (tests/fixtures/truth/, computed",
        "without orch by `python -m tests.truth`: the planted cause and rank, plain sqlite3 over the exports, the",
        "measured difference of a pair of runs). A row is a hit when orch's outcome, top finding (cause and root",
        "ranks, no victim blamed above `low`), saving (within ±20 % of the measured one; where the pair was also",
        "timed without the profiler, the finding's own estimate without it within ±20 % of that: `unprofiled`),",
        "step count and memory peaks all hold; a known miss names its reason (tests/scoreboard_known.json).",
        "",
        f"**{hits} of {len(rows)} hit.** The replay error: the replay of the unchanged trace against the measured",
        f"steps (summed |replayed - measured| over the measured time; a miss above {REPLAY_ERROR_PCT} % on a job that",
        "completed: a failing job's last steps are cut, and its graph with them); `-`: nothing",
        "replayed (one GPU, a CPU job, no NCCL work matched across ranks).",
        "",
        "| case | truth | orch's top finding | saving ms, truth / orch | replay error | verdict | what missed |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        why = "; ".join(r.missed)
        if r.case in known:
            why += f" — known: {known[r.case]}"
        lines.append(f"| {r.case} | {r.truth} | {r.orch} | {r.saving} | {r.replay_error} | {r.verdict} | {why} |")
    lines += ["", "## The cases", ""]
    lines += [f"- **{r.case}**: {r.about}" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--case", action="append", default=[], help="only this case (repeatable)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="cases at once (default: cores)")
    ap.add_argument("--json", type=Path, help="write the rows as JSON here")
    ap.add_argument("--markdown", type=Path, help="write the table as Markdown here (docs/scoreboard.md)")
    ap.add_argument("--keep", type=Path, help="keep each case's store and report under this directory")
    ap.add_argument("--reports", type=Path, help="judge the reports a --keep run left in this directory "
                    "instead of running orch again")
    ap.add_argument("--after-job", action="store_true", help="collect each case over parts with the map's "
                    "statistics (orch collect --parts --map-stats), as after a job whose ranks were mapped there")
    a = ap.parse_args(argv)
    known = json.loads((REPO / "tests" / "scoreboard_known.json").read_text())
    todo = truths(a.case)
    if a.reports:
        rows = [kept_case(t, a.reports) for t in todo]
    else:
        with concurrent.futures.ThreadPoolExecutor(max(1, a.jobs)) as pool:
            rows = list(pool.map(lambda t: run_case(t, a.keep, a.after_job), todo))
    width = max(len(r.case) for r in rows)
    for r in rows:
        mark = {"hit": "hit ", "miss": "MISS", "error": "ERR "}[r.verdict]
        tail = "; ".join(r.missed) + (" (known)" if r.case in known and r.verdict != "hit" else "")
        print(f"{mark} {r.case:<{width}}  {r.truth:<22} {r.orch:<44} {r.saving:<13} {tail}")
    print(f"{sum(r.verdict == 'hit' for r in rows)} of {len(rows)} hit")
    if a.json:
        a.json.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    if a.markdown:
        a.markdown.write_text(markdown(rows, known))
    return 2 if any(r.verdict == "error" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
