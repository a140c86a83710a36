"""Shared machinery of the untrusted-report tests (tests/test_untrusted_report*.py): hostile
exports built from the REAL gpu_e2e DDP exports (two good ranks, rank 1 the planted straggler
whose `data_load` range is the top finding), run through the real CLI (`orch analyze --json
--html`, `orch export-trace`, `orch diff J J`), and the assertions every case shares.

Planting reuses tests/test_untrusted_collect.py's helpers; this module adds only what the CLI
end of the pipeline needs."""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sqlite3
import subprocess
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import duckdb
import jsonschema

from tests.conftest import REPO, run_orch
from tests.test_untrusted_collect import plant

E2E = REPO / "tests" / "fixtures" / "gpu_e2e"
GOOD = ("ddp_r0_vm.763.sqlite", "ddp_r1_vm.742.sqlite")
BAD = "ddp_r2_vm.999.sqlite"  # the hostile third rank
SCHEMA = json.loads((REPO / "docs" / "report.schema.json").read_text())
# What must never reach a terminal from a trace: C0 (but \n and \t), DEL, C1, bidi overrides.
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
HTML_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "p", "ul", "li", "table", "tr", "td",
             "th", "thead", "tbody", "div", "span", "svg", "rect", "text", "details", "summary", "b", "script",
             "g", "path", "line", "defs", "marker", "br", "h3"}
RESULTS: dict[str, list[bool]] = defaultdict(list)


def decompress_base(dest: Path) -> list[Path]:
    """The two real DDP exports, decompressed (rank 0 sampled GPU metrics; rank 1 sleeps in data_load)."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name in GOOD:
        with gzip.open(E2E / f"{name}.gz", "rb") as fi, open(dest / name, "wb") as fo:
            shutil.copyfileobj(fi, fo)
        out.append(dest / name)
    return out


@dataclass
class Case:
    family: str
    prepare: Callable[[Path, list[Path]], None]  # (input folder with the good ranks, base files)
    expect: Iterable[str] = ()  # what stdout+stderr must say (the note naming what was wrong)
    planted: list[str] = field(default_factory=list)  # strings planted in the trace (HTML, terminal)
    args: list[str] = field(default_factory=list)
    in_name: str = "in"  # the input folder's name
    json_name: str = "r.json"
    html_name: str = "r.html"
    env: dict[str, str] = field(default_factory=dict)
    good: tuple[int, ...] = (0, 1)  # ranks that must be kept with status ok
    extra: Callable[[dict, Path], None] | None = None  # (report JSON, tmp dir)


def copy_bad(d: Path, base: list[Path], src: int = 1, name: str = BAD) -> Path:
    shutil.copy(base[src], d / name)
    return d / name


def plant_raw(f: Path, sql: str, value: str | bytes) -> None:
    """One UPDATE with one bound value written as TEXT, raw bytes allowed (invalid UTF-8)."""
    raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")
    con = sqlite3.connect(f)
    con.execute(sql, [raw])
    con.commit()
    con.close()


# Where a profiled program puts its own strings.
WHERE = {
    "nvtx": ["UPDATE NVTX_EVENTS SET text = CAST(? AS TEXT) WHERE text = 'data_load'"],
    "kernel": ["UPDATE StringIds SET value = CAST(? AS TEXT) WHERE id = (SELECT k.shortName FROM "
               "CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName WHERE s.value NOT LIKE 'nccl%' "
               "GROUP BY 1 ORDER BY count(*) DESC LIMIT 1)"],
    "thread": ["UPDATE StringIds SET value = CAST(? AS TEXT) WHERE id IN (SELECT nameId FROM ThreadNames)"],
    "host": ["UPDATE TARGET_INFO_SYSTEM_ENV SET value = CAST(? AS TEXT) WHERE name = 'Hostname'"],
}


def planter(text: str | bytes, where: Iterable[str] = tuple(WHERE)) -> Callable[[Path, list[Path]], None]:
    """A prepare step: a copy of the straggler rank 1 as rank 2, `text` planted in `where`."""
    def prepare(d: Path, base: list[Path]) -> None:
        f = copy_bad(d, base)
        for w in where:
            for q in WHERE[w]:
                plant_raw(f, q, text)
    return prepare


def sql_planter(*sql: str, src: int = 1, name: str = BAD) -> Callable[[Path, list[Path]], None]:
    def prepare(d: Path, base: list[Path]) -> None:
        plant(copy_bad(d, base, src, name), *sql)
    return prepare


# ------------------------------------------------------------------ the shared assertions

def check_terminal(p: subprocess.CompletedProcess[str], what: str, escapes: bool = True) -> None:
    """Exit 0 or 2 with orch's one-line error, no traceback; no control character on either
    stream (`escapes`; analyze's output is checked case by case, `_check_case`)."""
    assert p.returncode in (0, 2), (what, p.returncode, p.stderr[-3000:])
    assert "Traceback" not in p.stderr, (what, p.stderr[-3000:])
    for stream, text in (("stdout", p.stdout), ("stderr", p.stderr)) if escapes else ():
        bad = {repr(m.group()) for m in CONTROL.finditer(text)}
        assert not bad, (what, stream, bad)
    if p.returncode == 2:
        lines = p.stderr.strip().splitlines()
        assert lines and lines[-1].startswith("orch: error: "), (what, p.stderr[-2000:])


def walk_numbers(obj: object, unit: str | None = None, path: str = "") -> list[str]:
    """Every number under a key ending in _pct (0..100) or _ms (>= 0), finite; returns offences."""
    bad: list[str] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            k = str(k)
            u = "pct" if k.endswith("pct") else "ms" if (k.endswith("_ms") or k == "ms" or k.startswith("ms_")) \
                else unit
            bad += walk_numbers(v, u, f"{path}.{k}")
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            bad += walk_numbers(v, unit, f"{path}[{i}]")
    elif isinstance(obj, float | int) and not isinstance(obj, bool):
        finite = obj == obj and obj not in (float("inf"), float("-inf"))
        if not finite or (unit == "pct" and not 0 <= obj <= 100) or (unit == "ms" and obj < 0):
            bad.append(f"{path}={obj}")
    return bad


def strings(obj: object) -> list[str]:
    """Every string of a JSON value, dict keys included."""
    if isinstance(obj, dict):
        return [s for k, v in obj.items() for s in (str(k), *strings(v))]
    if isinstance(obj, list):
        return [s for v in obj for s in strings(v)]
    return [obj] if isinstance(obj, str) else []


def check_json(j: Path, good: Iterable[int]) -> dict:
    rep = json.loads(j.read_text(encoding="utf-8"))
    jsonschema.validate(rep, SCHEMA)
    st = {r["rank"]: r["status"] for r in rep["ranks"]}
    for rk in good:
        assert st.get(rk) == "ok", ("good rank lost", rk, st, rep["problems"])
    bad = walk_numbers(rep)
    assert not bad, bad[:20]
    return rep


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, [a for a, _ in attrs]))


def check_html(h: Path, planted: Iterable[str]) -> None:
    doc = h.read_text(encoding="utf-8")
    for s in planted:
        if "<" in s or "&" in s:
            assert s not in doc, ("unescaped in HTML", s[:80])
    parser = _Tags()
    parser.feed(doc)
    tags = [t for t, _ in parser.tags]
    assert set(tags) <= HTML_TAGS, set(tags) - HTML_TAGS
    assert tags.count("script") == 1, "a planted <script>"
    assert not [a for _, attrs in parser.tags for a in attrs if a.lower().startswith("on")], "event handler"


def check_trace(trace: Path, store: Path) -> None:
    """export-trace keeps every kernel of every rank (invalid UTF-8 once dropped half of them)."""
    ev = json.loads(trace.read_text(encoding="utf-8"))["traceEvents"]
    got: dict[int, int] = defaultdict(int)
    for e in ev:
        if e.get("cat") in ("compute", "comm"):
            got[e["pid"]] += 1
    con = duckdb.connect(str(store), read_only=True)
    try:
        want = dict(con.execute("SELECT rank, count(*) FROM kernels GROUP BY rank").fetchall())
    finally:
        con.close()
    assert dict(got) == want, (dict(got), want)


def _run_cli(tmp: Path, d: Path, case: Case) -> tuple[dict, str]:
    """analyze / export-trace / diff over the input folder `d`, with the assertions that hold for
    the input as a whole (exit status, no traceback, every good rank, every kernel in the trace):
    (report JSON, analyze's output, also kept in tmp/analyze.txt)."""
    outd = tmp / "out"
    outd.mkdir(exist_ok=True)
    store, j, h = tmp / "store", outd / case.json_name, outd / case.html_name
    p = run_orch("analyze", str(d), "--out", str(store), "--json", str(j), "--html", str(h), *case.args,
                 env=case.env)
    text = p.stdout + p.stderr
    (tmp / "analyze.txt").write_text(text, encoding="utf-8")
    check_terminal(p, "analyze", escapes=False)
    assert p.returncode == 0, p.stderr[-2000:]  # every case keeps good ranks: a report is due
    rep = check_json(j, case.good)
    trace = tmp / "t.json"
    t = run_orch("export-trace", str(store / "profile.duckdb"), "-o", str(trace))
    check_terminal(t, "export-trace")
    assert t.returncode == 0, t.stderr
    check_trace(trace, store / "profile.duckdb")
    df = run_orch("diff", str(j), str(j))
    check_terminal(df, "diff")
    assert df.returncode == 0 and "0 regression(s)" in df.stdout, df.stdout[-2000:] + df.stderr[-2000:]
    return rep, text


def _check_case(tmp: Path, case: Case, rep: dict, shown: str, mine: list[str] | None) -> None:
    """What one case's own strings must do in the outputs: no control character on the terminal
    that is its own (one of `mine`'s; every one when the case had the input to itself: None),
    what it must say, nothing of it unescaped in the HTML, and its own checks."""
    leaked = {m.group() for m in CONTROL.finditer(shown)}
    own = leaked if mine is None else {c for c in leaked if any(c in s for s in mine)}
    assert not own, ("control characters on the terminal", sorted(map(repr, own)))
    for e in case.expect:
        assert e in shown, ("not reported", e, shown[-3000:])
    check_html(tmp / "out" / case.html_name, case.planted)
    if case.extra:
        case.extra(rep, tmp)


def run_case(tmp: Path, base: list[Path], case: Case) -> dict | None:
    """Build the input, run analyze / export-trace / diff, assert; record the outcome."""
    ok = False
    try:
        d = tmp / case.in_name / "in"
        d.mkdir(parents=True)
        (tmp / "out").mkdir()
        for f in base:
            shutil.copy(f, d / f.name)
        case.prepare(d, base)
        rep, shown = _run_cli(tmp, d, case)
        _check_case(tmp, case, rep, shown, None)
        ok = True
        return rep
    finally:
        RESULTS[case.family].append(ok)


def _hostile_name(rank: int) -> str:
    """A hostile rank's file in a family's input: ranks 2, 3, ... after the two good ones."""
    return f"ddp_r{rank}_vm.{900 + rank}.sqlite"


class Family:
    """The cases of one family in ONE input, a hostile rank per case (each case's one planted
    file renamed to its own rank), through the CLI once: analyze, export-trace and diff run on
    all of them together, and each case's test asserts on that run what it asserted on an input
    of its own. A failure of the whole run fails every case, naming the run's error; a case's
    own checks name it through its test's id."""

    def __init__(self, tmp: Path, base: list[Path], cases: dict[str, Case]) -> None:
        self.tmp, self.base, self.cases = tmp, base, cases
        self.rank = {key: 2 + i for i, key in enumerate(sorted(cases))}
        self._rep: dict | None = None
        self._shown = ""  # analyze's output
        self._nobodys: list[str] = []  # control characters in it that no case planted: every case's
        self._error: BaseException | None = None
        self._ran = False

    def _build(self) -> Path:
        d = self.tmp / "in" / "in"
        d.mkdir(parents=True)
        for f in self.base:
            shutil.copy(f, d / f.name)
        for key in sorted(self.cases):
            case = self.cases[key]
            scratch = self.tmp / "cases" / key
            scratch.mkdir(parents=True)
            case.prepare(scratch, self.base)
            made = sorted(scratch.iterdir())
            assert len(made) == 1, (f"case {key}: a family's case plants one file, made {made}: "
                                    "run it with run_case")
            made[0].rename(d / _hostile_name(self.rank[key]))
        return d

    def _run(self) -> None:
        self._ran = True
        try:
            (self.tmp / "out").mkdir(parents=True)
            first = self.cases[min(self.cases)]
            command = {(tuple(c.args), tuple(c.env.items()), c.json_name, c.html_name, c.good)
                       for c in self.cases.values()}
            assert len(command) == 1, "a family's cases run one command: those that differ run with run_case"
            self._rep, self._shown = _run_cli(self.tmp, self._build(), first)
            planted = "".join(s for c in self.cases.values() for s in c.planted)
            self._nobodys = [c for c in {m.group() for m in CONTROL.finditer(self._shown)} if c not in planted]
        except Exception as e:  # every case reports it
            self._error = e

    def check(self, key: str) -> dict:
        """One case's assertions on the family's run; records the outcome under its family."""
        case = self.cases[key]
        ok = False
        try:
            if not self._ran:
                self._run()
            if self._error is not None:
                raise AssertionError(f"the family's run ({len(self.cases)} cases) failed: {self._error!r}")
            assert self._rep is not None
            _check_case(self.tmp, case, self._rep, self._shown, [*case.planted, *self._nobodys])
            for e in case.expect:  # a note of the rank table: on this case's own rank's line
                said = [ln for ln in self._shown.splitlines() if re.match(r"rank \d+: ", ln) and e in ln]
                mine = f"rank {self.rank[key]}: "
                assert not said or any(ln.startswith(mine) for ln in said), ("said of other ranks only", e, said)
            ok = True
            return self._rep
        finally:
            RESULTS[case.family].append(ok)


def families(base: list[Path], tmp_path_factory) -> Callable[[dict[str, Case]], Family]:
    """A module's families, each run once: `families(cases)` is the Family of those cases (one
    family's cases, all of them, in one dict)."""
    made: dict[str, Family] = {}

    def get(cases: dict[str, Case]) -> Family:
        (name,) = {c.family for c in cases.values()}
        if name not in made:
            made[name] = Family(tmp_path_factory.mktemp("family"), base, cases)
        assert made[name].cases is cases, f"family {name!r}: one dict holds all its cases"
        return made[name]
    return get


def print_counts(families: Iterable[str], title: str, capsys) -> list[str]:
    lines = [f"{fam}: {sum(RESULTS[fam])}/{len(RESULTS[fam])} handled" for fam in families if RESULTS.get(fam)]
    with capsys.disabled():
        print(f"\n{title}:\n  " + "\n  ".join(lines))
    return lines
