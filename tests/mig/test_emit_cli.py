"""Emitters (mig-parted, labels, Slurm), sharing configs, and the `gpufleet mig` CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.errors import ConfigError, ParseError, UnknownNameError
from gpufleet.mig.demand import parse_demand
from gpufleet.mig.emit import kubectl_label_commands, mig_parted_config, node_labels, slurm_lines
from gpufleet.mig.fleet import parse_gpus
from gpufleet.mig.planner import MigPlan, plan_exact
from gpufleet.mig.sharing import mps_commands, mps_config, parse_mps_clients, time_slicing_config

runner = CliRunner()


def _plan() -> MigPlan:
    # 4g@0 + 1g@4 on one GPU (hand-worked), second GPU stays MIG off
    return plan_exact(parse_gpus("2xh200"), parse_demand("a: 1 x 1g.18gb, b: 1 x 4g.71gb"))


def test_mig_parted_and_labels() -> None:
    plan = _plan()
    doc = mig_parted_config(plan)
    assert doc["version"] == "v1"
    name = node_labels(plan)["node-0"]["nvidia.com/mig.config"]
    assert doc["mig-configs"][name] == [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"1g.18gb": 1, "4g.71gb": 1}},
        {"devices": [1], "mig-enabled": False},
    ]
    assert doc["mig-configs"]["all-disabled"] == [{"devices": "all", "mig-enabled": False}]
    assert len(name) <= 63
    assert kubectl_label_commands(plan) == [
        f"kubectl label node node-0 nvidia.com/mig.config={name} --overwrite"
    ]


def test_uniform_node_gets_readable_name() -> None:
    plan = plan_exact(parse_gpus("1xh200"), parse_demand("a: 2 x 3g.71gb"))
    assert node_labels(plan) == {"node-0": {"nvidia.com/mig.config": "gpufleet-all-2x3g.71gb"}}


def test_slurm_lines() -> None:
    lines = slurm_lines(_plan())
    assert lines["slurm.conf"] == [
        "NodeName=node-0 Gres=gpu:1g.18gb:1,gpu:4g.71gb:1,gpu:h200-sxm:1"
    ]
    assert lines["gres.conf"] == ["NodeName=node-0 AutoDetect=nvml"]


def test_time_slicing_and_mps_configs() -> None:
    ts = time_slicing_config(4)
    assert ts["version"] == "v1"
    assert ts["sharing"]["timeSlicing"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 4}]
    mps = mps_config(3)
    assert mps["sharing"]["mps"]["resources"] == [{"name": "nvidia.com/gpu", "replicas": 3}]
    with pytest.raises(ConfigError, match="at least 2"):
        time_slicing_config(1)


def test_mps_bare_metal_commands() -> None:
    clients = parse_mps_clients(["infer:60:80G", "batch:60:80G"])
    doc = mps_commands(2, clients, gpu_memory_bytes=141 * 10**9)
    assert "nvidia-cuda-mps-control -d" in doc["start"]
    assert "nvidia-smi -i 2 -c EXCLUSIVE_PROCESS" in doc["start"]
    assert "echo quit | nvidia-cuda-mps-control" in doc["stop"]
    env = doc["clients"][0]["env"]
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "60"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=80G"
    assert env["CUDA_VISIBLE_DEVICES"] == "2"
    assert len(doc["warnings"]) == 2  # 160 GiB > 131 GiB, and 120 % of threads
    with pytest.raises(ParseError, match=r"1\.\.100"):
        parse_mps_clients(["x:150"])


def test_cli_plan_json_and_out(tmp_path: Path) -> None:
    r = runner.invoke(
        app,
        [
            "mig",
            "plan",
            "--gpus",
            "8xh200",
            "--json",
            "--out",
            str(tmp_path),
            "--demand",
            "team-a: 6 x 1g.18gb, team-b: 2 x 3g.71gb",
        ],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["exact"]["gpus_used"] == 2
    assert doc["exact"]["unplaced"] == {}
    assert doc["first_fit"]["method"] == "first-fit"
    assert (tmp_path / "mig-parted.yaml").exists()
    # the written layout is a valid --current for a re-plan with no change
    r = runner.invoke(
        app,
        [
            "mig",
            "plan",
            "--current",
            str(tmp_path / "layout.yaml"),
            "--json",
            "--demand",
            "team-a: 6 x 1g.18gb, team-b: 2 x 3g.71gb",
        ],
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["exact"]["gpus_repartitioned"] == 0


def test_cli_plan_table_and_errors() -> None:
    r = runner.invoke(app, ["mig", "plan", "--gpus", "2xh200", "--demand", "a: 1 x 4g.71gb"])
    assert r.exit_code == 0 and "first-fit" in r.output
    r = runner.invoke(app, ["mig", "plan", "--gpus", "2xh200", "--demand", "a: 1 x 4g.71g"])
    assert isinstance(r.exception, UnknownNameError)  # main() prints it as one line, exit 2
    assert "4g.71gb" in r.exception.suggestions


def test_cli_sharing(tmp_path: Path) -> None:
    r = runner.invoke(app, ["mig", "sharing", "time-slicing", "--replicas", "4", "--json"])
    assert json.loads(r.stdout)["sharing"]["timeSlicing"]["resources"][0]["replicas"] == 4
    r = runner.invoke(app, ["mig", "sharing", "mps", "--replicas", "2", "--out", str(tmp_path)])
    assert yaml.safe_load((tmp_path / "mps.yaml").read_text())["sharing"]["mps"]
    r = runner.invoke(app, ["mig", "sharing", "mps-daemon", "--client", "a:50:20G", "--json"])
    assert json.loads(r.stdout)["clients"][0]["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
