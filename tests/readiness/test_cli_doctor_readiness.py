"""`gpufleet doctor` with the readiness checks: a captured tree (--root), the declarations
(--cuda, --ib-rate or a plan's port rate, --link-layer), the verdict exit codes and --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from tests.readiness.test_readiness_checks import HEALTHY, tree

runner = CliRunner()
SRC = Path(__file__).parents[2] / "src"


def doctor(*args: str) -> tuple[int, dict[str, Any]]:
    result = runner.invoke(app, ["doctor", "--json", *args])
    return result.exit_code, json.loads(result.stdout)


def test_healthy_tree_exits_0_with_every_phase_in_json() -> None:
    code, doc = doctor("--root", str(HEALTHY), "--cuda", "12.4", "--ib-rate", "400")
    assert code == 0, doc
    assert doc["status"] == "ok" and doc["readiness"]["status"] == "ok"
    phases = [c["phase"] for c in doc["readiness"]["checks"]]
    assert phases[0] == "driver" and phases[-1] == "host"  # in install order
    assert all(c["hint"] is None for c in doc["readiness"]["checks"])
    assert doc["nodes"] == []  # --root checks the tree, not this host's NVML


def test_exit_codes_follow_the_verdict_convention(tmp_path: Path) -> None:
    # warn: nvidia-persistenced not running -> 1
    assert doctor("--root", str(tree(tmp_path / "w", "no-persistenced")))[0] == 1
    # fail: InfiniBand port down -> 2
    code, doc = doctor("--root", str(tree(tmp_path / "f", "ib-port-down")))
    assert code == 2 and doc["status"] == "fail"
    # unknown: a CUDA release the catalog does not know -> 3
    assert doctor("--root", str(HEALTHY), "--cuda", "12.7")[0] == 3


def test_the_plan_gives_the_port_rate(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    cand = {"candidate": "hgx", "fabric": {"port_gbps": 800}}
    plan.write_text(json.dumps({"chosen": "hgx", "candidates": [cand]}))
    code, doc = doctor("--root", str(HEALTHY), "--plan", str(plan))
    ports = [c for c in doc["readiness"]["checks"] if c["phase"] == "network"]
    assert code == 2 and len(ports) == 8
    assert all("declared 800" in c["detail"] for c in ports)
    # --ib-rate wins over the plan
    assert doctor("--root", str(HEALTHY), "--plan", str(plan), "--ib-rate", "400")[0] == 0


def test_link_layer_declared_as_ethernet_fails_infiniband_ports() -> None:
    code, doc = doctor("--root", str(HEALTHY), "--link-layer", "eth")
    assert code == 2
    assert all(c["status"] == "fail" for c in doc["readiness"]["checks"] if c["phase"] == "network")


def _cli(*args: str) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(SRC), "NO_COLOR": "1", "COLUMNS": "200"}
    done = subprocess.run(
        [sys.executable, "-m", "gpufleet", "doctor", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    return done.returncode, done.stderr


@pytest.mark.process
def test_bad_declarations_exit_3_with_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "plan.json"
    bad.write_text("{\n  oops\n}")
    for args, words in [
        (("--link-layer", "fddi"), "--link-layer 'fddi'"),
        (("--plan", str(bad)), "line 2"),
        (("--root", str(tmp_path / "absent")), "not a directory"),
        (("--ib-rate", "-1"), "--ib-rate"),
    ]:
        code, err = _cli("--root", str(HEALTHY), *args)
        assert code == 3, (args, err)
        assert words in err and "Traceback" not in err
