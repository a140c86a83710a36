"""Report outputs through the real CLI: terminal, JSON schema, HTML in headless Chromium,
`orch diff` exit status, and the Perfetto trace."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import need, run_orch

pytestmark = [pytest.mark.jobs, pytest.mark.browser]

RANK_KEYS = {"rank", "host", "stage", "compute_ms", "comm_ms", "overlap_ms", "comm_overlap_pct",
             "exposed_comm_ms", "gpu_busy_ms", "gpu_idle_pct", "nccl_wait_ms", "late_count",
             "gaps_by_range_ms", "step_ms"}


@pytest.fixture(scope="module")
def analyzed(gpu_fixtures: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = {}
    for case, extra in (("ddp_straggler", []), ("pp_imbalance", ["--layout", "pp=2,dp=1"]),
                        ("ddp_capture", [])):
        d = tmp_path_factory.mktemp(case)
        p = run_orch("analyze", str(gpu_fixtures / case), *extra, "--out", str(d / "store"),
                     "--json", str(d / "r.json"), "--html", str(d / "r.html"))
        assert p.returncode == 0, p.stderr
        assert "findings" in p.stdout
        out[case] = d
    return out


def test_json_schema(analyzed: dict[str, Path]) -> None:
    rep = json.loads((analyzed["pp_imbalance"] / "r.json").read_text())
    assert {"window", "ranks", "stages", "imbalance", "stragglers", "findings", "steps"} <= set(rep)
    for r in rep["ranks"]:
        assert set(r) >= RANK_KEYS
    for f in rep["findings"]:
        assert {"kind", "ranks", "severity", "evidence", "fix"} <= set(f) and f["evidence"]
    assert rep["imbalance"]["slowest_stage"] == 1 and {"stage", "ranks", "compute_ms", "bubble_pct"} <= set(
        rep["stages"][0])
    s = json.loads((analyzed["ddp_straggler"] / "r.json").read_text())["stragglers"][0]
    assert {"rank", "late_count", "wait_caused_ms"} <= set(s) and s["rank"] == 1


def test_rank_bars_draw_the_analysis_split_of_the_window(analyzed: dict[str, Path]) -> None:
    """The per-rank bars are the JSON's numbers (rank_metrics), and their parts add up to the window."""
    for case in ("ddp_straggler", "pp_imbalance"):
        rep = json.loads((analyzed[case] / "r.json").read_text())
        page = (analyzed[case] / "r.html").read_text()
        for r in rep["ranks"]:
            parts = {"compute": r["compute_ms"], "comm transfer": r["exposed_transfer_ms"],
                     "comm waiting": r["exposed_wait_ms"], "other GPU": r["other_gpu_ms"], "idle": r["idle_ms"]}
            assert sum(parts.values()) == pytest.approx(r["window_ms"], abs=0.01), r
            assert r["exposed_transfer_ms"] + r["exposed_wait_ms"] == pytest.approx(r["exposed_comm_ms"], abs=0.002)
            for name, ms in parts.items():
                assert f"<title>rank {r['rank']} {name}: {ms:.3f} ms</title>" in page, (case, r["rank"], name)


def test_html_renders_in_chromium(analyzed: dict[str, Path], tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    need(chromium is not None, "chromium not installed (scripts/install_system_deps.sh)")
    html = analyzed["pp_imbalance"] / "r.html"
    text = html.read_text()
    assert "<script src" not in text and "http://" not in text and "https://" not in text  # self-contained
    assert text.count("<script") == 1  # only the tables' inline sort script
    p = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                        "--disable-background-networking", "--disable-component-update", "--disable-sync",
                        f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", html.as_uri()],
                       capture_output=True, text=True, timeout=120)
    dom = p.stdout
    assert p.returncode == 0 and "</html>" in dom, p.stderr[-2000:]
    bars = re.search(r'<svg id="rank-bars".*?</svg>', dom, re.S).group(0)
    # 2 ranks x 5 segments (compute, NCCL transfer, NCCL waiting, other GPU, idle)
    assert len(re.findall(r'<rect class="seg"', bars)) == 2 * 5
    assert 'data-part="comm waiting"' in bars
    heat = re.search(r'<svg id="step-heatmap".*?</svg>', dom, re.S).group(0)
    rep = json.loads((analyzed["pp_imbalance"] / "r.json").read_text())
    assert len(re.findall(r'<rect class="cell"', heat)) == sum(len(s["ms_by_rank"]) for s in rep["steps"])
    stages = re.search(r'<svg id="stage-bars".*?</svg>', dom, re.S).group(0)
    assert len(re.findall(r'<rect class="stage"', stages)) == 2
    assert 'id="findings"' in dom and "pipeline stage 1" in dom
    shot = tmp_path / "shot.png"
    subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                    f"--user-data-dir={tmp_path / 'profile2'}", f"--screenshot={shot}", "--window-size=1000,1400",
                    html.as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 10_000


def test_diff_flags_regression(analyzed: dict[str, Path], tmp_path: Path) -> None:
    base = analyzed["ddp_capture"] / "r.json"
    same = run_orch("diff", str(base), str(base))
    assert same.returncode == 0 and "0 regression(s)" in same.stdout
    worse = json.loads(base.read_text())
    worse["ranks"][1]["gpu_idle_pct"] += 12.0
    (tmp_path / "worse.json").write_text(json.dumps(worse))
    p = run_orch("diff", str(base), str(tmp_path / "worse.json"), "--json", str(tmp_path / "d.json"))
    assert p.returncode == 1 and "REGRESSED" in p.stdout
    d = json.loads((tmp_path / "d.json").read_text())
    assert [(r["rank"], r["metric"]) for r in d["regressions"]] == [(1, "gpu_idle_pct")]


def test_export_trace_one_process_per_rank(analyzed: dict[str, Path], tmp_path: Path) -> None:
    store = analyzed["ddp_straggler"] / "store" / "profile.duckdb"
    out = tmp_path / "trace.json"
    p = run_orch("export-trace", str(store), "-o", str(out))
    assert p.returncode == 0, p.stderr
    events = json.loads(out.read_text())["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert procs == {0: "rank 0 (vm)", 1: "rank 1 (vm)"}
    kernels = [e for e in events if e.get("cat") in ("compute", "comm")]
    assert len(kernels) == 2 * 1736 and all(e["dur"] >= 0 for e in kernels)
    assert "ENVIRONMENT" not in out.read_text()


def test_report_cli_errors(tmp_path: Path) -> None:
    p = run_orch("report", str(tmp_path / "nope"))
    assert p.returncode == 2 and "no run with job id or directory" in p.stderr
    p = run_orch("analyze", str(tmp_path))
    assert p.returncode == 2 and "no reports" in p.stderr
    p = run_orch("report", "x", "--steps", "5:2")
    assert p.returncode == 2


def test_json_validates_against_shipped_schema(analyzed: dict[str, Path]) -> None:
    """docs/report.schema.json is generated from the Report model and every report validates."""
    import jsonschema

    from orchestrator.analyze.model_report import json_schema

    shipped = Path(__file__).parents[1] / "docs" / "report.schema.json"
    assert shipped.read_text() == json_schema(), \
        "regenerate: python -m orchestrator.analyze.model_report > " + str(shipped)
    schema = json.loads(shipped.read_text())
    for case in analyzed.values():
        jsonschema.validate(json.loads((case / "r.json").read_text()), schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"schema_version": 2, "ranks": "nope"}, schema)
