"""Untrusted trace DATA end to end through the real CLI: invalid UTF-8, odd numbers, a bad rank
beside good ones, a gzip bomb, impossible rows (negative durations, missing or duplicated
StringIds, NVTX ranges ending before they start, absurd GPU metrics, a user kernel named like
NCCL), ranks of different jobs, odd file and folder names. Each case is planted in a copy of a
real export beside the two unmodified ranks, then `orch analyze --json --html`, `orch
export-trace` and `orch diff J J` run; the shared assertions are in tests/untrusted_report_kit.py,
and each case names what the output must say about it. The cases of invalid UTF-8 and of impossible
rows share one input per family, a hostile rank per case, and one run of the three commands
(`Family`); the others differ in the input's names or the command and run one by one. Counts per
family: the last test."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.test_untrusted_collect import JOBS, NUMBERS, UTF8, _dup_strings, _gz, _negative, plant
from tests.untrusted_report_kit import (
    BAD,
    RESULTS,
    Case,
    Family,
    copy_bad,
    decompress_base,
    families,
    planter,
    print_counts,
    run_case,
    sql_planter,
)

pytestmark = pytest.mark.replay

FAMILIES = ("invalid utf-8", "numbers", "bad rank beside good", "gzip bomb", "impossible data", "different jobs",
            "paths")


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return decompress_base(tmp_path_factory.mktemp("e2e-base"))


@pytest.fixture(scope="module")
def family(base: list[Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[[dict[str, Case]], Family]:
    return families(base, tmp_path_factory)


UTF8_CASES = {**{case: Case("invalid utf-8", sql_planter(sql), expect=["U+FFFD"]) for case, (sql, _) in UTF8.items()},
              " everywhere": Case("invalid utf-8", planter(b"da\xfft\xc3a_\xed\xa0\x80"), expect=["U+FFFD"])}


@pytest.mark.parametrize("case", sorted(UTF8))
def test_invalid_utf8(family, case: str) -> None:
    family(UTF8_CASES).check(case)


def test_invalid_utf8_everywhere_at_once(family) -> None:
    family(UTF8_CASES).check(" everywhere")


@pytest.mark.parametrize("case", sorted(NUMBERS))
def test_odd_numbers(base: list[Path], tmp_path: Path, case: str) -> None:
    name, sql, status = NUMBERS[case]
    # rank 0's copy: a rank that cannot be placed must not take the real rank 0 down
    said = ["rank 2: partial"] if "_r2_" in name and status == "partial" else [name, status]
    run_case(tmp_path, base, Case("numbers", sql_planter(*sql, src=0, name=name), expect=said))


def _write(name: str, data: bytes):
    def prepare(d: Path, base: list[Path]) -> None:
        (d / name).write_bytes(data)
    return prepare


def _truncated(d: Path, base: list[Path]) -> None:
    data = base[0].read_bytes()
    (d / BAD).write_bytes(data[: len(data) // 3])


def _other_sqlite(d: Path, base: list[Path]) -> None:
    plant(d / BAD, "CREATE TABLE notes (id INTEGER, body TEXT)", "INSERT INTO notes VALUES (1, '[/]\x1b[2J')")


def _second_rank0_by_name(d: Path, base: list[Path]) -> None:
    shutil.copy(base[1], d / "ddp_r0_vm.555.sqlite")  # rank 1's data claiming rank 0 in its name


BESIDE = {
    "rank_minus1_first": (sql_planter("UPDATE META_DATA_CAPTURE SET value = 'RANK=\"-1\"' WHERE value LIKE 'RANK=%'",
                                      src=0, name="a_first_vm.1.sqlite"), ["a_first_vm.1.sqlite"]),
    "empty_file": (_write(BAD, b""), [BAD]),
    "text_file": (_write(BAD, b"\x1b]0;owned\x07 not sqlite [/]"), [BAD]),
    "truncated": (_truncated, [BAD]),
    "other_sqlite": (_other_sqlite, [BAD]),
    "rank0_twice_env": (lambda d, b: shutil.copy(b[0], d / "prof_vm.7.sqlite"), ["prof_vm.7.sqlite", "duplicate"]),
    "rank0_twice_name": (_second_rank0_by_name, ["ddp_r0_vm.555.sqlite"]),
    "bad_gz": (_write(BAD + ".gz", b"\x1f\x8b\x08\x00garbage"), [BAD + ".gz"]),
}


@pytest.mark.parametrize("case", sorted(BESIDE))
def test_bad_rank_beside_good_ones(base: list[Path], tmp_path: Path, case: str) -> None:
    prep, expect = BESIDE[case]
    run_case(tmp_path, base, Case("bad rank beside good", prep, expect=expect))


def test_gzip_bomb(base: list[Path], tmp_path: Path) -> None:
    def extra(rep: dict, tmp: Path) -> None:
        assert not [p for p in (tmp / "store").rglob("*") if "r2" in p.name], "the bomb's output was left"

    run_case(tmp_path, base, Case("gzip bomb", lambda d, b: _gz(d / f"{BAD}.gz", 32 << 20),
                                  expect=["ORCH_MAX_EXPORT_BYTES"], env={"ORCH_MAX_EXPORT_BYTES": "8000000"},
                                  extra=extra))


_OUT = "GPU metric samples outside 0..100 %"
_STEP = "SELECT rowid FROM NVTX_EVENTS WHERE text LIKE 'step%'"
IMPOSSIBLE = {
    "negative_durations": (lambda d, b: _negative(d, b), ["end before they start"]),
    "duplicate_string_ids": (lambda d, b: _dup_strings(d, b), ["StringIds repeats"]),
    "missing_string_ids": (sql_planter("DROP TABLE StringIds"), ["unclassifiable"]),
    "start_not_a_number": (sql_planter("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'x' WHERE rowid = 3"),
                           ["ingest failed"]),
    "step_ranges_reversed": (sql_planter(f"UPDATE NVTX_EVENTS SET end = start - 5 WHERE rowid IN ({_STEP})"),
                             ["end before they start"]),
    "all_kernels_reversed": (sql_planter("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = start - 1000"),
                             ["end before they start"]),
    "kernel_far_future": (sql_planter("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = start + 1000000000000000, "
                                      "end = end + 1000000000000000 WHERE rowid = 5"), []),
    "kernel_rows_repeated": (sql_planter("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL SELECT * FROM "
                                         "CUPTI_ACTIVITY_KIND_KERNEL"), []),
    "gpu_metrics_negative": (sql_planter("UPDATE GPU_METRICS SET value = -50", src=0), [_OUT]),
    "gpu_metrics_huge": (sql_planter("UPDATE GPU_METRICS SET value = 9223372036854775807", src=0), [_OUT]),
    "gpu_metrics_mixed": (sql_planter("UPDATE GPU_METRICS SET value = CASE WHEN rowid % 2 = 0 THEN 1000000 "
                                      "ELSE -1000000 END", src=0), [_OUT]),
}


# A user's JIT kernel called ncclDevKernel_*: counted as communication (by name, as nsys does),
# but no metric may go out of range because of it.
IMPOSSIBLE_CASES = {**{case: Case("impossible data", prep, expect=expect)
                       for case, (prep, expect) in IMPOSSIBLE.items()},
                    " nccl-named kernel": Case("impossible data",
                                               planter("ncclDevKernel_AllReduce_Sum_f32_RING_LL", ["kernel"]))}


@pytest.mark.parametrize("case", sorted(IMPOSSIBLE))
def test_impossible_data(family, case: str) -> None:
    family(IMPOSSIBLE_CASES).check(case)


def test_user_kernel_named_like_nccl(family) -> None:
    family(IMPOSSIBLE_CASES).check(" nccl-named kernel")


@pytest.mark.parametrize("case", sorted(JOBS))
def test_ranks_of_different_jobs(base: list[Path], tmp_path: Path, case: str) -> None:
    run_case(tmp_path, base, Case("different jobs", sql_planter(JOBS[case]), expect=["different jobs"]))


@pytest.mark.parametrize("folder", ["a#b", "pct%41", "q?x=1", "it's [/]", "sp ace&[x]"])
def test_odd_input_folders(base: list[Path], tmp_path: Path, folder: str) -> None:
    run_case(tmp_path, base, Case("paths", planter("[/]", ["nvtx"]), in_name=folder))


def test_question_mark_file_beside_prefix(base: list[Path], tmp_path: Path) -> None:
    def prepare(d: Path, b: list[Path]) -> None:
        (d / b[0].name).rename(d / "x?_r0_vm.1.sqlite")
        (d / b[1].name).rename(d / "x%3F_r1_vm.2.sqlite")
        (d / "x").write_bytes(b"not this one")

    run_case(tmp_path, base, Case("paths", prepare))


def test_markup_in_file_names(base: list[Path], tmp_path: Path) -> None:
    run_case(tmp_path, base, Case("paths", lambda d, b: copy_bad(d, b, 1, "ddp_r2_[bold red]h[red].9.sqlite")))


def test_escape_in_file_name(base: list[Path], tmp_path: Path) -> None:
    run_case(tmp_path, base, Case("paths", lambda d, b: copy_bad(d, b, 1, "ddp_r2_h\x1b[2J\x1b]0;t\x07.9.sqlite")))


def test_family_counts_reported(capsys: pytest.CaptureFixture[str]) -> None:
    """Runs last: tried / handled per family (all must be handled)."""
    lines = print_counts(FAMILIES, "untrusted report families (data)", capsys)
    if os.environ.get("PYTEST_XDIST_WORKER") is None and any(RESULTS.get(f) for f in FAMILIES):
        assert all(all(RESULTS[f]) for f in FAMILIES if RESULTS.get(f)), lines
