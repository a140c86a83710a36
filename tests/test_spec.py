"""Job spec validation: every bad input is one line naming the field and fix, exit 2,
no traceback, and nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.errors import OrchError
from orchestrator.spec.load import load_job, metric_set_for_gpu
from orchestrator.spec.ranks import collector_ranks, format_ranges, parse_rank_list, select_ranks
from tests.conftest import EXAMPLES, run_orch

pytestmark = pytest.mark.fast

BASE = {
    "name": "t",
    "cluster": "local",
    "launch": {"script": str(EXAMPLES / "train.py"), "nproc_per_node": 2},
}


def write_spec(tmp_path: Path, **over) -> Path:
    spec = yaml.safe_load(yaml.safe_dump(BASE))
    for dotted, value in over.items():
        node = spec
        keys = dotted.split("__")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(spec))
    return p


@pytest.mark.parametrize("over, needle", [
    ({"profle": {"ranks": "all"}}, "unknown key 'profle'"),
    ({"launch__nproc_per_node": "many"}, "launch.nproc_per_node"),
    ({"profile__ranks": "0,5"}, "rank 5 is outside the world size 2"),
    ({"profile__ranks": "one-per-stage"}, "one-per-stage needs the parallel layout"),
    ({"profile__ranks": "3-1"}, "reversed"),
    ({"profile__gpu_metrics": {"enabled": True}}, "no known metric set for GPU 'none'"),
    ({"cluster": "no-such-cluster"}, "no cluster config named 'no-such-cluster'"),
    ({"cluster": "./missing/cluster.yaml"}, "does not exist"),
    ({"profile__trace": ["cuda", "bogus"]}, "profile.trace.1"),
    ({"slurm__extra_sbatch": ["--x=1\n#SBATCH --y"]}, "slurm.extra_sbatch"),
    ({"name": "../escape"}, "name"),
    ({"layout": {"pp": 3}}, "does not divide the world size 2"),
    ({"profile__capture_range": "nvtx"}, "capture_range_nvtx"),
])
def test_bad_spec_is_one_line_exit_2_nothing_written(tmp_path: Path, over, needle) -> None:
    spec = write_spec(tmp_path, **over)
    out = tmp_path / "out"
    for cmd in (["validate", str(spec)], ["render", str(spec), "-o", str(out)]):
        p = run_orch(*cmd, cwd=tmp_path)
        assert p.returncode == 2, p.stderr
        lines = p.stderr.strip().splitlines()
        assert len(lines) == 1, p.stderr
        assert needle in lines[0]
        assert "Traceback" not in p.stderr
    assert not out.exists()
    assert sorted(x.name for x in tmp_path.iterdir()) == ["job.yaml"]


def test_invalid_yaml_and_non_mapping(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("name: [unclosed\n")
    (tmp_path / "b.yaml").write_text("- just\n- a list\n")
    for f, needle in (("a.yaml", "not valid YAML"), ("b.yaml", "must be a YAML mapping")):
        p = run_orch("validate", str(tmp_path / f))
        assert p.returncode == 2 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_rank_selection() -> None:
    assert parse_rank_list("0,8-11, 3", 16) == [0, 3, 8, 9, 10, 11]
    assert select_ranks("first-per-node", world=16, nproc_per_node=8, stage_size=None) == [0, 8]
    assert select_ranks("one-per-stage", world=16, nproc_per_node=8, stage_size=4) == [0, 4, 8, 12]
    assert select_ranks([3, 1], world=4, nproc_per_node=2, stage_size=None) == [1, 3]
    assert select_ranks("none", world=4, nproc_per_node=2, stage_size=None) == []
    assert format_ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    # one collector per node: the node's lowest profiled rank
    assert collector_ranks([1, 2, 3, 9, 12], nproc_per_node=8) == [1, 9]
    with pytest.raises(OrchError, match="outside the world size"):
        parse_rank_list("16", 16)


def test_gpu_metric_sets() -> None:
    assert metric_set_for_gpu("NVIDIA H200") == "gh100"
    assert metric_set_for_gpu("H100-SXM5-80GB") == "gh100"
    assert metric_set_for_gpu("A100-SXM4-80GB") == "ga100"
    assert metric_set_for_gpu("NVIDIA L4") == "ad10x"
    assert metric_set_for_gpu("NVIDIA L40S") == "ad10x"
    assert metric_set_for_gpu("Tesla T4") == "tu10x"
    assert metric_set_for_gpu("GeForce RTX 4090") == "ad10x"
    assert metric_set_for_gpu("GeForce RTX 2080") == "tu10x"
    assert metric_set_for_gpu("none") is None


def test_examples_validate_and_resolve() -> None:
    multi = load_job(EXAMPLES / "slurm-multinode.yaml")
    assert (multi.world_size, multi.dp, multi.pp) == (32, 16, 2)
    assert multi.profiled_ranks == [0, 8, 16, 24]
    assert multi.collector_ranks == [0, 8, 16, 24]  # one per node
    assert multi.gpu_metrics_set == "gh100"
    gpu = load_job(EXAMPLES / "local-gpu.yaml")
    assert gpu.collector_ranks == [0] and gpu.profiled_ranks == [0, 1]
    for f in sorted(EXAMPLES.glob("*.yaml")):
        p = run_orch("validate", str(f))
        assert p.returncode == 0, p.stderr


def test_gpu_metrics_flag_follows_nsys_version() -> None:
    from orchestrator.spec.model import NsysInstall

    assert NsysInstall(version="2022.4.2").metrics_flag() == "--gpu-metrics-device"
    assert NsysInstall(version="2023.2.3").metrics_flag() == "--gpu-metrics-device"
    assert NsysInstall(version="2025.3.1").metrics_flag() == "--gpu-metrics-devices"
    assert NsysInstall(version="2022.4", gpu_metrics_flag="--gpu-metrics-devices").metrics_flag() == \
        "--gpu-metrics-devices"
