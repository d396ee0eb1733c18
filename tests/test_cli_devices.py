"""`gpufleet inventory`, `status` and `doctor` on the simulator and on imported reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from tests.cli import cli_json
from tests.conftest import FIXTURES, H200, real_gpu_available

runner = CliRunner()


def test_inventory_json_shape_on_the_simulator() -> None:
    doc = cli_json("inventory", "--sim", "2x8xh100-sxm")
    assert [n["name"] for n in doc["nodes"]] == ["sim-00", "sim-01"]
    g = doc["nodes"][1]["gpus"][7]
    for key in (
        "index",
        "uuid",
        "name",
        "model",
        "memory_total_bytes",
        "driver_version",
        "vbios_version",
        "pcie_gen_current",
        "pcie_gen_max",
        "pcie_width_current",
        "pcie_width_max",
    ):
        assert key in g
    assert g["index"] == 7 and g["model"] == "h100-sxm" and g["name"] == "NVIDIA H100 80GB HBM3"
    assert g["memory_total_bytes"] == 81559 * 2**20
    assert doc["drift"] == []
    assert doc["gpu_count"] == 16


def test_inventory_finds_drift_in_a_fleet_file(tmp_path: Path) -> None:
    f = tmp_path / "fleet.yaml"
    f.write_text(
        "nodes:\n  - {name: n, model: h100, gpus: 2, count: 3}\n"
        "  - {name: old, model: h100, gpus: 2, driver_version: '535.161.08'}\n"
        "faults:\n  - {node: n-01, gpu: 1, kind: pcie_downgrade, width: 8}\n"
    )
    doc = cli_json("inventory", "--sim", str(f))
    fields = sorted((d["kind"], d["field"]) for d in doc["drift"])
    assert ("version", "driver_version") in fields
    assert ("pcie_link", "pcie_link") in fields
    link = next(d for d in doc["drift"] if d["kind"] == "pcie_link")
    assert link["values"] == {"Gen5 x8": ["n-01/1"]}


def test_inventory_imports_the_real_h200_capture() -> None:
    doc = cli_json("inventory", "--import", str(H200 / "nvidia-smi-q.xml"))
    g = doc["nodes"][0]["gpus"][0]
    assert g["name"] == "NVIDIA H200" and g["model"] == "h200-sxm"
    assert g["vbios_version"] == "96.00.A5.00.1A" and g["driver_version"] == "580.159.04"
    assert g["uuid"] == "GPU-a9be1d05-4c94-ff08-6f9e-9571d1d634c3"
    assert (g["pcie_gen_current"], g["pcie_width_max"]) == (5, 16)


def test_inventory_import_multi_gpu_drift() -> None:
    doc = cli_json("inventory", "--import", str(FIXTURES / "smi" / "h200x8-v13.xml"))
    assert len(doc["nodes"][0]["gpus"]) == 8
    assert any(d["field"] == "vbios_version" for d in doc["drift"])


def test_status_json_reports_load_and_reasons() -> None:
    doc = cli_json("status", "--sim", "4x2xh100", "--busy")
    gpus = [g for n in doc["nodes"] for g in n["gpus"]]
    assert len(gpus) == 8
    # --busy means busy (issue 17): every GPU runs one of the mix's loads, none idles
    assert all(g["gpu_util_pct"] >= 30 for g in gpus)
    assert not any("idle" in g["clock_event_reasons_words"] for g in gpus)
    assert all(g["power_w"] > 100 for g in gpus)
    idle = cli_json("status", "--sim", "4x2xh100")  # without --busy every GPU idles
    assert all(g["gpu_util_pct"] == 0 for n in idle["nodes"] for g in n["gpus"])


def test_status_busy_with_the_default_seed_on_one_node() -> None:
    """One node with seed 7 used to draw "idle" and show every GPU at 0 % under --busy."""
    doc = cli_json("status", "--sim", "1x8xh100-sxm", "--busy")
    assert all(g["gpu_util_pct"] > 0 for g in doc["nodes"][0]["gpus"])


def test_status_table_renders() -> None:
    result = runner.invoke(app, ["status", "--sim", "1x2xh200"], env={"COLUMNS": "160"})
    assert result.exit_code == 0
    assert "h200-sxm" in result.stdout and "idle" in result.stdout


def test_doctor_on_a_healthy_simulated_node() -> None:
    doc = cli_json("doctor", "--sim", "1x2xh200")
    assert doc["status"] == "ok"
    names = {c["name"] for n in doc["nodes"] for c in n["checks"]}
    assert {"nvml", "driver_library_match", "gpus"} <= names


def test_doctor_flags_persistence_and_ecc(tmp_path: Path) -> None:
    f = tmp_path / "fleet.yaml"
    f.write_text(
        "nodes: [{name: n, model: h100, gpus: 2}]\n"
        "faults:\n  - {node: n, gpu: 0, kind: persistence_off}\n"
        "  - {node: n, gpu: 1, kind: ecc_disabled}\n"
    )
    result = runner.invoke(app, ["doctor", "--sim", str(f), "--json"])
    assert result.exit_code == 1
    doc = json.loads(result.stdout)
    warned = {c["name"]: c for n in doc["nodes"] for c in n["checks"] if c["status"] == "warn"}
    assert (
        "gpu0.persistence" in warned and "nvidia-persistenced" in warned["gpu0.persistence"]["hint"]
    )
    assert "gpu1.ecc" in warned


@pytest.mark.skipif(real_gpu_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("command", ["inventory", "status", "doctor"])
@pytest.mark.process
def test_without_gpu_one_line_and_exit_2(command: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet", command],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2
    if command != "doctor":
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "--sim" in lines[0] and "Traceback" not in proc.stderr


def test_status_and_inventory_fit_80_columns_without_splitting_figures() -> None:
    """At 80 columns the boxed tables used to wrap every cell: "35/38" became "35/3" + "8"."""
    status = runner.invoke(app, ["status", "--sim", "2x2xh100"], env={"COLUMNS": "80"})
    assert status.exit_code == 0, status.output
    lines = status.stdout.splitlines()
    assert max(len(ln) for ln in lines) <= 80
    assert any("h100-sxm" in ln and "35/38" in ln and "70/700" in ln for ln in lines)
    inv = runner.invoke(
        app,
        ["inventory", "--import", str(FIXTURES / "smi" / "h200x8-v13.xml")],
        env={"COLUMNS": "80"},
    )
    assert inv.exit_code == 0, inv.output
    assert max(len(ln) for ln in inv.stdout.splitlines()) <= 80
    assert any("580.159.04" in ln and "4x16/5x16" in ln for ln in inv.stdout.splitlines())
    wide = runner.invoke(app, ["status", "--sim", "1x1xh100"], env={"COLUMNS": "160"})
    assert "┏" in wide.stdout  # a wide terminal keeps the boxed table


def test_status_lost_gpu_row_keeps_the_table_readable(tmp_path: Path) -> None:
    f = tmp_path / "fleet.yaml"
    f.write_text(
        "nodes: [{name: n, model: h100, gpus: 2}]\n"
        "faults: [{node: n, gpu: 1, kind: fallen_off_bus}]\n"
    )
    result = runner.invoke(app, ["status", "--sim", str(f)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    row0 = next(ln for ln in result.stdout.splitlines() if ln.startswith("n    0"))
    assert "0.6/80" in row0 and "35/38" in row0  # not squeezed by the lost GPU's message
    row1 = next(ln for ln in result.stdout.splitlines() if ln.startswith("n    1"))
    assert "lost" in row1 and "GPU 1 on n" in row1


def test_status_watch_json_is_json_lines_only() -> None:
    """`status --watch --json` used to print a live table and an indented document mixed."""
    result = runner.invoke(
        app,
        ["status", "--sim", "1x2xh100", "--watch", "--count", "3", "--interval", "0.1", "--json"],
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    assert all(len(json.loads(ln)["nodes"][0]["gpus"]) == 2 for ln in lines)


def test_sim_and_import_together_is_a_usage_error() -> None:
    """--import used to be ignored silently when --sim was given too."""
    from gpufleet.errors import UsageError

    result = runner.invoke(
        app, ["inventory", "--sim", "1x1xh100", "--import", str(H200 / "nvidia-smi-q.xml")]
    )
    assert isinstance(result.exception, UsageError) and result.exception.exit_code == 2
    assert "mutually exclusive" in str(result.exception)


def test_import_of_a_directory_says_so(tmp_path: Path) -> None:
    result = runner.invoke(app, ["inventory", "--import", str(tmp_path)])
    assert result.exception is not None and "is a directory" in str(result.exception)
    assert getattr(result.exception, "exit_code", None) == 2


@pytest.mark.process
def test_error_messages_keep_their_square_brackets() -> None:
    """Rich markup ate `[tenant:]` out of `expected '[tenant:] N x PROFILE'`."""
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet", "mig", "plan", "--gpus", "8xh200", "--demand", "junk"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "expected '[tenant:] N x PROFILE'" in proc.stderr
