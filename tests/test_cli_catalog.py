"""`gpufleet catalog ...`: JSON output, tables, and one-line errors with did-you-mean (exit 2)."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from gpufleet.cli.app import app

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


def _json(args: list[str]) -> Any:
    result = runner.invoke(app, ["catalog", *args, "--json"])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def _table(args: list[str]) -> str:
    """``gpufleet catalog ARGS`` as a 200-column table (it must succeed): what it printed."""
    result = runner.invoke(app, ["catalog", *args], env=WIDE)
    assert result.exit_code == 0
    return result.stdout


def _refused(args: list[str]) -> Result:
    """``gpufleet catalog ARGS``, which must exit 2 (bad input)."""
    result = runner.invoke(app, ["catalog", *args])
    assert result.exit_code == 2
    return result


def test_gpus_json() -> None:
    doc = _json(["gpus"])
    rows = {r["key"]: r for r in doc["gpus"]}
    assert len(rows) == 14
    h200 = rows["h200-sxm"]
    assert (h200["bf16_tflops"], h200["fp8_tflops"], h200["max_power_w"]) == (989.5, 1979, 700)
    assert (h200["memory_bandwidth_gbps"], h200["gpu_link"]) == (4800, "nvlink")
    assert h200["memory_bytes"] == 143771 * 2**20
    assert rows["a100-sxm4-80gb"]["fp8_tflops"] is None
    assert rows["l4"]["gpu_link"] == "none"


def test_gpus_table() -> None:
    out = _table(["gpus"])
    for text in ("h200-sxm", "989.5", "mi300x", "NVLink4 900 GB/s"):
        assert text in out


def test_gpu_json_has_every_figure_with_source() -> None:
    doc = _json(["gpu", "h200"])
    assert doc["key"] == "h200-sxm"
    figures = {f["field"]: f for f in doc["figures"]}
    assert figures["memory_bandwidth_gbps"]["value"] == 4800
    assert "datasheet" in figures["memory_bandwidth_gbps"]["source"]
    assert "143771" in figures["memory_bytes"]["source"]
    assert figures["tflops.bf16"]["value"] == 989.5
    assert figures["pci_device_ids"]["value"] == ["0x233510DE"]
    assert all(f["source"] for f in doc["figures"])
    assert doc["efficiency"]["tflops"]["bf16"] > 700


def test_gpu_by_nvml_name() -> None:
    assert _json(["gpu", "NVIDIA H100 80GB HBM3"])["key"] == "h100-sxm"


def test_gpu_table() -> None:
    out = _table(["gpu", "l40s"])
    assert "sm_count" in out and "142" in out


def test_unknown_gpu_did_you_mean_exit_2() -> None:
    result = _refused(["gpu", "h10-sxm"])
    assert "unknown GPU model 'h10-sxm'" in result.stderr
    assert "did you mean" in result.stderr and "h100-sxm" in result.stderr
    assert result.stdout == ""


@pytest.mark.process
def test_unknown_gpu_through_console_entry_point_exits_2() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gpufleet", "catalog", "gpu", "h10-sxm", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "h100-sxm" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_systems_json() -> None:
    systems = {s["key"]: s for s in _json(["systems"])["systems"]}
    assert set(systems) >= {"dgx-a100", "dgx-h100", "dgx-h200", "dgx-b200"}
    assert (systems["dgx-b200"]["max_power_kw"], systems["dgx-b200"]["rack_units"]) == (14.3, 10)
    assert systems["dgx-a100"]["compute_nic_gbps"] == 200
    assert all(s["source"] for s in systems.values())


def test_mig_json() -> None:
    doc = _json(["mig", "h200"])
    assert doc["model"] == "h200-sxm"
    profiles = {p["name"]: p for p in doc["profiles"]}
    assert profiles["3g.71gb"]["placements"] == [0, 4]
    assert profiles["1g.18gb"]["max_instances"] == 7
    assert profiles["7g.141gb"]["placement_size"] == 8


def test_mig_table() -> None:
    out = _table(["mig", "a100-sxm4-40gb"])
    assert "1g.5gb" in out and "{0,2,4,6}:2" in out


def test_mig_on_gpu_without_mig_exit_2() -> None:
    assert "does not support MIG" in _refused(["mig", "l4"]).stderr


def test_xid_json() -> None:
    doc = _json(["xid"])
    codes = {x["code"]: x for x in doc["xids"]}
    assert {13, 48, 79, 94, 154} <= set(codes)
    one = _json(["xid", "79"])
    assert (one["code"], one["action"], one["severity"]) == (79, "reboot_node", "fail")
    assert _json(["xid", "13"])["application_level"] is True


def test_unknown_xid_exit_2() -> None:
    assert "unknown XID code '7'" in _refused(["xid", "7"]).stderr
