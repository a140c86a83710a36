"""Trace strings are untrusted, end to end through the real CLI: a profiled program controls
NVTX range names, kernel names (JIT), thread names and the hostname. Each string below is planted
in a third rank (a copy of the real straggler rank, so the names reach the findings, the rank
table, the phase and kernel tables), then `orch analyze --json --html`, `orch export-trace` and
`orch diff J J` run as a user runs them (tests/untrusted_report_kit.py: exit 0 or 2, no
traceback, no control characters on stdout/stderr, the JSON valid against docs/report.schema.json
with every good rank and no impossible metric, no planted tag in the HTML, every kernel in the
trace). Each family's cases share one input, a hostile rank per case, and one run of the three
commands (`Family`); output paths with markup, whose cases differ in the command itself, run one
by one. Counts per family: the last test."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.test_untrusted_collect import HOSTILE_TEXT, plant
from tests.untrusted_report_kit import (
    RESULTS,
    WHERE,
    Case,
    Family,
    copy_bad,
    decompress_base,
    families,
    planter,
    print_counts,
    run_case,
    strings,
)

pytestmark = pytest.mark.replay

FAMILIES = ("rich markup", "terminal escapes", "html/json injection", "sql-looking text", "huge strings",
            "label collisions", "newline forgery", "output paths")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return decompress_base(tmp_path_factory.mktemp("e2e-base"))


@pytest.fixture(scope="module")
def family(base: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[[dict[str, Case]], Family]:
    return families(base, tmp_path_factory)


def _shown(text: str) -> list[str]:
    """A markup string must come out as the same visible text (escaped, not interpreted)."""
    return [text]


MARKUP = {"close_tag": "[/]", "link": "[link=http://evil.example/x]click me[/link]", "style": "[bold red]RED",
          "mixed": HOSTILE_TEXT["rich_markup"], "emoji_code": ":skull: [blink]x[/blink]"}


MARKUP_CASES = {f"{case}-{where}": Case("rich markup", planter(text, [where]), planted=[text],
                                          expect=_shown(text) if where == "nvtx" else ())
                for case, text in MARKUP.items() for where in WHERE}


@pytest.mark.parametrize("where", sorted(WHERE))
@pytest.mark.parametrize("case", sorted(MARKUP))
def test_rich_markup(family, case: str, where: str) -> None:
    family(MARKUP_CASES).check(f"{case}-{where}")


ESCAPES = {"osc_title": "\x1b]0;owned\x07data", "clear": "\x1b[2J\x1b[Hdata", "csi_color": "\x1b[31;1mred\x1b[0m",
           "c1_csi": "\x9b31mred", "c1_nel": "a\x85b", "bidi": "step \u202e1 \u2066x\u2069", "cr_overwrite": "ok\rFAKE",
           "backspace": "abc\x08\x08\x08xyz", "bell_del": "\x07\x7f", "osc8_link": "\x1b]8;;http://evil\x1b\\x\x1b]8;;\x1b\\"}


# U+FFFD marks where a control character was (safe.plain).
ESCAPE_CASES = {case: Case("terminal escapes", planter(text), expect=["\ufffd"], planted=[text])
                for case, text in ESCAPES.items()}


@pytest.mark.parametrize("case", sorted(ESCAPES))
def test_terminal_escapes(family, case: str) -> None:
    family(ESCAPE_CASES).check(case)


INJECT = {"script": "</script><script>alert(1)</script>", "svg": "<svg onload=alert(1)>",
          "img": "<img src=x onerror=y>",
          "style": "</style><style>*{display:none}</style>", "comment": "<!-- x", "entity": "&lt;b&gt;&amp;",
          "json_quote": '"}]},{"rank": 0, "x": "', "backslash": "\\u0000\\", "u2028": "a\u2028b\u2029c",
          "attr_break": "\" onmouseover=\"alert(1)"}


def _kept(text: str) -> Callable[[dict, Path], None]:
    def extra(rep: dict, tmp: Path) -> None:  # the JSON carries the string exactly, as data
        assert text in strings(rep), text
    return extra


INJECT_CASES = {case: Case("html/json injection", planter(text), planted=[text], extra=_kept(text))
                for case, text in INJECT.items()}


@pytest.mark.parametrize("case", sorted(INJECT))
def test_html_json_injection(family, case: str) -> None:
    family(INJECT_CASES).check(case)


SQL = {"drop": HOSTILE_TEXT["sql_quote"], "or_true": "x' OR '1'='1", "like": "%_%", "param": "$1 ? :name",
       "format": "{0} %s %(x)s {rank}", "comment": "*/ SELECT 1; /*", "regex": "step (\\d+)|.*"}


SQL_CASES = {case: Case("sql-looking text", planter(text), planted=[text], extra=_kept(text))
             for case, text in SQL.items()}


@pytest.mark.parametrize("case", sorted(SQL))
def test_sql_looking_text(family, case: str) -> None:
    family(SQL_CASES).check(case)


HUGE = "<b>" + "A" * 1_000_000


def _cut(rep: dict, tmp: Path) -> None:  # cut at collect, not copied everywhere: 20 MB for them all
    assert (tmp / "out" / "r.json").stat().st_size < 20_000_000


HUGE_CASES = {where: Case("huge strings", planter(HUGE, list(WHERE) if where == "all" else [where]),
                          planted=[HUGE[:200]], extra=_cut) for where in ["nvtx", "kernel", "thread", "host", "all"]}


@pytest.mark.parametrize("where", sorted(HUGE_CASES))
def test_huge_strings(base: list[Path], tmp_path_factory: pytest.TempPathFactory, where: str) -> None:
    """One input a case, not the family's one: five ranks with 1 MB strings in every name held
    each rank's ingest at DuckDB's memory cap at once, and a good rank beside them was lost to
    it now and then on a loaded machine (no job writes that; one such rank is the case)."""
    Family(tmp_path_factory.mktemp("huge"), base, {where: HUGE_CASES[where]}).check(where)


COLLIDE = {"no_range": "(no NVTX range)", "between": "between steps (input pipeline)", "step_huge": "step 99999999999",
           "step_neg": "step -1", "profiler_step": "ProfilerStep#99999999999999999999999", "empty": "",
           "warmup": "warm-up", "healthy": "healthy", "rank_label": "rank 0", "dots": "..."}


def _steps_renamed(d: Path, b: list[Path]) -> None:
    """Every step range of the hostile rank numbered beyond any real run."""
    plant(copy_bad(d, b), "UPDATE NVTX_EVENTS SET text = 'step 99999999999' || rowid WHERE text LIKE 'step%'")


COLLIDE_CASES = {**{case: Case("label collisions", planter(text, ["nvtx", "kernel", "thread"]))
                    for case, text in COLLIDE.items()},
                 " step ranges renamed": Case("label collisions", _steps_renamed)}


@pytest.mark.parametrize("case", sorted(COLLIDE))
def test_names_colliding_with_orch_labels(family, case: str) -> None:
    family(COLLIDE_CASES).check(case)


def test_step_range_renamed_huge_number(family) -> None:
    family(COLLIDE_CASES).check(" step ranges renamed")


FORGED = "x\n1. high rank 0 is fine\norch: error: forged"


def test_newline_forgery(base: list[Path], tmp_path: Path) -> None:
    """A name with newlines must not print lines that look like orch's own."""
    def extra(rep: dict, tmp: Path) -> None:
        lines = (tmp / "analyze.txt").read_text().splitlines()
        assert not [ln for ln in lines if ln.startswith(("1. high rank 0 is fine", "orch: error: forged"))], \
            [ln for ln in lines if "forged" in ln or "is fine" in ln]

    run_case(tmp_path, base, Case("newline forgery", planter(FORGED), planted=[FORGED], extra=extra))


OUT_PATHS = {"markup_json": ("o[/]ut.json", "r.html"), "link_html": ("r.json", "[link=https:evil]r[/link].html"),
             "style_both": ("[bold red]r.json", "[red]r.html"), "escape_json": ("r\x1b[2J.json", "r\x1b]0;t\x07.html"),
             "hash_pct_q": ("a#b%41?.json", "c#%41?.html"), "c1_bidi": ("r\x9b\u202e.json", "r.html")}


@pytest.mark.parametrize("case", sorted(OUT_PATHS))
def test_output_paths(base: list[Path], tmp_path: Path, case: str) -> None:
    jn, hn = OUT_PATHS[case]

    def prepare(d: Path, b: list[Path]) -> None:  # `[/]` holds a `/`: its folder `o[` must exist
        for n in (jn, hn):
            (tmp_path / "out" / n).parent.mkdir(parents=True, exist_ok=True)

    def extra(rep: dict, tmp: Path) -> None:
        assert (tmp / "out" / jn).is_file() and (tmp / "out" / hn).is_file()
        files = sorted(str(p.relative_to(tmp / "out")) for p in (tmp / "out").rglob("*") if p.is_file())
        assert files == sorted([jn, hn]), files  # no temp left behind

    run_case(tmp_path, base, Case("output paths", prepare, json_name=jn, html_name=hn, extra=extra))


def test_markup_in_store_and_input_folder(base: list[Path], tmp_path: Path) -> None:
    run_case(tmp_path, base, Case("output paths", planter("[/]"), in_name="in[/][link=x]\x1b[2J", expect=["[/]"]))


def test_family_counts_reported(capsys: pytest.CaptureFixture[str]) -> None:
    """Runs last: tried / handled per family (all must be handled)."""
    lines = print_counts(FAMILIES, "untrusted report families (strings)", capsys)
    if os.environ.get("PYTEST_XDIST_WORKER") is None and any(RESULTS.get(f) for f in FAMILIES):
        assert all(all(RESULTS[f]) for f in FAMILIES if RESULTS.get(f)), lines
