"""`inventory/status/health --import` on real and edited nvidia-smi reports: what operators need
is kept, plain-text reports read like XML, partial imports keep what parses, and odd files
(UTF-16, a newer DTD, duplicates, same file names) are read and warned about.

Expected values are read by hand from the fixtures (tests/fixtures/nvidia-h200/, the real H200
capture; tests/fixtures/smi/ and its README.md), not from the code's output.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.devices.smi import parse_smi_xml_file
from gpufleet.devices.smi.importer import import_reports
from gpufleet.devices.smi.text_report import parse_smi_text
from gpufleet.errors import ParseError
from tests.conftest import FIXTURES, H200

runner = CliRunner()
MULTI = FIXTURES / "smi" / "h200x8-v13.xml"
MIG = FIXTURES / "smi" / "h200-mig-v12.xml"
OLD = FIXTURES / "smi" / "a100x2-v11.xml"
MIB = 2**20


def invoke(*args: str, code: int = 0) -> dict[str, Any]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == code, result.output
    doc = json.loads(result.stdout)
    assert isinstance(doc, dict)
    return doc


def imports(*paths: Path) -> list[str]:
    return [a for p in paths for a in ("--import", str(p))]


def test_plain_text_report_reads_like_the_xml() -> None:
    text = parse_smi_text((H200 / "nvidia-smi-q.txt").read_text(), "q.txt")
    xml = parse_smi_xml_file(H200 / "nvidia-smi-q.xml")
    t, x = text.gpus[0], xml.gpus[0]
    # identity and settings are the same in both captures
    for name in ("uuid", "name", "model", "pci_bus_id", "serial", "vbios_version",
                 "memory_total_bytes", "power_limit_enforced_w", "max_sm_clock_mhz",
                 "pcie_gen_max", "pcie_width_current", "persistence_mode", "ecc_current",
                 "mig_current", "slowdown_temp_c", "shutdown_temp_c"):  # fmt: skip
        assert getattr(t.info, name) == getattr(x.info, name), name
    # values read by hand from nvidia-smi-q.txt
    assert t.info.uuid == "GPU-a9be1d05-4c94-ff08-6f9e-9571d1d634c3"
    assert (t.info.slowdown_temp_c, t.info.shutdown_temp_c) == (89, 95)  # 35 + 52 + 2 / + 8
    assert t.sample.power_w == pytest.approx(79.70)
    assert t.sample.power_instant_w == pytest.approx(79.32)
    assert (t.sample.sm_clock_mhz, t.sample.mem_clock_mhz) == (345, 3201)
    assert t.sample.clock_event_reasons == 0x1  # Idle: Active
    assert t.sample.pcie_tx_bytes_per_s == 958 * 1024
    assert t.info.memory_total_bytes == 143771 * MIB
    assert t.clock_event_counters_us == {
        "sw_power_cap": 0,
        "sync_boost": 0,
        "sw_therm_slowdown": 0,
        "hw_therm_slowdown": 0,
        "hw_power_brake": 0,
    }
    assert (text.driver_version, text.attached_gpus) == ("580.159.04", 1)


def test_text_report_errors_name_the_line() -> None:
    text = (H200 / "nvidia-smi-q.txt").read_text()
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.strip().startswith("Total") and "143771" in ln)
    lines[at] = lines[at].replace("143771 MiB", "12x MiB")
    with pytest.raises(ParseError) as exc:
        parse_smi_text("\n".join(lines), "q.txt")
    assert exc.value.where == f"line {at + 1}, gpu[0]/fb_memory_usage/total"
    assert "'12x MiB' is not a number" in exc.value.problem


def test_text_report_mig_devices_and_nesting() -> None:
    """MIG devices and the nested HW slowdown reasons in the text layout."""
    text = (H200 / "nvidia-smi-q.txt").read_text()
    thermal = "            HW Thermal Slowdown                        : "
    text = text.replace(thermal + "Not Active", thermal + "Active")
    mig = (
        "    MIG devices\n"
        "        MIG Device\n"
        "            Index                             : 0\n"
        "            GPU Instance ID                   : 2\n"
        "            Compute Instance ID               : 0\n"
        "            Device Attributes\n"
        "                Shared\n"
        "                    Multiprocessor count      : 60\n"
        "            FB Memory Usage\n"
        "                Total                         : 71424 MiB\n"
        "                Used                          : 12 MiB\n"
        "                Free                          : 71412 MiB\n"
    )
    text = text.replace("    Accounting Mode  ", mig + "    Accounting Mode  ", 1)
    gpu = parse_smi_text(text).gpus[0]
    assert gpu.sample.clock_event_reasons == 0x1 | 0x40
    (dev,) = gpu.mig_devices
    assert (dev.gpu_instance_id, dev.sm_count, dev.profile_name) == (2, 60, "3g.71gb")
    assert dev.memory_used_bytes == 12 * MIB


def test_inventory_import_keeps_readings_mig_and_flags(tmp_path: Path) -> None:
    off = tmp_path / "pm-off.xml"
    off.write_text(
        (H200 / "nvidia-smi-q.xml")
        .read_text()
        .replace("<persistence_mode>Enabled", "<persistence_mode>Disabled")
    )
    doc = invoke("inventory", *imports(H200 / "nvidia-smi-q.xml", MIG, off))
    real, mig, pm = (n["gpus"][0] for n in doc["nodes"])
    r = real["reading"]
    # nvidia-smi-q.xml: average 79.60 W of 700.00 W, 345/1980 MHz, 35 C (memory 39 C)
    assert r["power_w"] == pytest.approx(79.60) and r["power_limit_w"] == 700.0
    assert (r["sm_clock_mhz"], r["max_sm_clock_mhz"], r["mem_clock_mhz"]) == (345, 1980, 3201)
    assert (r["gpu_temp_c"], r["mem_temp_c"]) == (35.0, 39.0)
    assert (r["slowdown_temp_c"], r["shutdown_temp_c"]) == (89, 95)
    assert r["gpu_util_pct"] == 0.0 and r["clock_event_reasons_words"] == ["idle"]
    assert real["clock_event_counters_us"]["hw_power_brake"] == 0
    assert real["attention"] == []
    # MIG: three GPU instances with profile, memory; nvidia-smi -q prints no placement
    devs = mig["mig_devices"]
    assert [d["profile"] for d in devs] == ["3g.71gb", "2g.35gb", "1g.18gb"]
    assert [d["memory_total_bytes"] for d in devs] == [71424 * MIB, 33280 * MIB, 16384 * MIB]
    assert [d["gpu_instance_id"] for d in devs] == [1, 5, 13]
    assert all(d["placement"] is None for d in devs)
    assert mig["reading"]["gpu_util_pct"] is None  # N/A under MIG, not 0
    assert any("persistence mode off" in a for a in pm["attention"])
    assert doc["import"]["failed"] == []
    # the three files are the same GPU (edited copies): warned, still three nodes
    assert len(doc["import"]["warnings"]) == 2


def _lost_fleet(tmp_path: Path) -> Path:
    """The 8-GPU report with GPU 3's UUID unreadable and GPU 5 lost."""
    text = MULTI.read_text()
    gpus = text.split("<gpu id=")
    gpus[4] = re.sub(r"<uuid>[^<]*</uuid>", "<uuid>[Unknown Error]</uuid>", gpus[4])
    gpus[6] = re.sub(r"<product_name>[^<]*<", "<product_name>GPU is lost<", gpus[6])
    f = tmp_path / "lost.xml"
    f.write_text("<gpu id=".join(gpus))
    return f


def test_unreadable_gpus_and_files_do_not_lose_the_others(tmp_path: Path) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text("<nvidia_smi_log><gpu>")  # truncated
    doc = invoke("inventory", *imports(_lost_fleet(tmp_path), bad, MIG), code=1)
    lost, mig = doc["nodes"]
    assert [g["index"] for g in lost["gpus"]] == [0, 1, 2, 4, 6, 7]
    assert len(mig["gpus"]) == 1
    failed = doc["import"]["failed"]
    assert len(failed) == 3
    assert any("gpu[3]" in f and "Unknown Error" in f for f in failed)
    assert any("gpu[5]" in f and "GPU is lost" in f for f in failed)
    assert any(f.startswith(str(bad)) and "not well-formed" in f for f in failed)
    # status and health judge the same files: exit 1 / fail, lost GPU named
    st = invoke("status", *imports(_lost_fleet(tmp_path), bad), code=1)
    assert len(st["import"]["failed"]) == 3
    result = runner.invoke(app, ["health", *imports(_lost_fleet(tmp_path)), "--json"])
    assert result.exit_code == 1, result.output
    health = json.loads(result.stdout)
    assert health["verdict"] == "fail"
    findings = health["nodes"][0]["findings"]
    gpus_failed = {f["gpu_index"] for f in findings if f["severity"] == "fail"}
    assert {3, 5} <= gpus_failed


def test_no_device_handle_lines_are_listed(tmp_path: Path) -> None:
    f = tmp_path / "node.xml"
    f.write_text(
        "Unable to determine the device handle for GPU0000:5D:00.0: GPU is lost.  "
        "Reboot the system to recover this GPU\n" + (H200 / "nvidia-smi-q.xml").read_text()
    )
    result = import_reports([f])
    assert len(result.nodes[0].report.gpus) == 1
    assert result.failed == [
        f"{f}: GPU 0000:5D:00.0: GPU is lost.  Reboot the system to recover this GPU"
    ]
    # attached_gpus (1) still matches: the lost GPU is not in the document
    assert any("attached_gpus says 1" in w and "2 GPU(s)" in w for w in result.warnings)


def test_attached_gpus_mismatch_and_duplicate_uuids_warn(tmp_path: Path) -> None:
    f = tmp_path / "nine.xml"
    f.write_text(MULTI.read_text().replace("<attached_gpus>8<", "<attached_gpus>9<"))
    doc = invoke("inventory", *imports(f, MULTI))
    warnings = doc["import"]["warnings"]
    assert any("attached_gpus says 9" in w and "8 GPU(s)" in w for w in warnings)
    assert any("8 GPU UUID(s) also in" in w for w in warnings)


def test_same_file_name_stays_two_nodes_with_drift(tmp_path: Path) -> None:
    a, b = tmp_path / "a" / "node.xml", tmp_path / "b" / "node.xml"
    a.parent.mkdir()
    b.parent.mkdir()
    text = (H200 / "nvidia-smi-q.xml").read_text()
    a.write_text(text)
    b.write_text(text.replace("580.159.04", "580.95.05").replace("a9be1d05", "b9be1d05"))
    doc = invoke("inventory", *imports(a, b))
    assert [n["name"] for n in doc["nodes"]] == ["a/node", "b/node"]
    drift = [d for d in doc["drift"] if d["field"] == "driver_version"]
    assert drift and set(drift[0]["values"]) == {"580.159.04", "580.95.05"}


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-8-sig"])
def test_utf16_and_bom_reports_are_read(tmp_path: Path, encoding: str) -> None:
    f = tmp_path / "ps.xml"
    text = (H200 / "nvidia-smi-q.xml").read_text()
    # an XML declaration naming UTF-8 inside a UTF-16 file is what PowerShell leaves
    f.write_bytes(text.encode(encoding))
    doc = invoke("inventory", *imports(f))
    assert doc["nodes"][0]["gpus"][0]["uuid"] == "GPU-a9be1d05-4c94-ff08-6f9e-9571d1d634c3"


def test_undecodable_report_is_refused_by_encoding(tmp_path: Path) -> None:
    f = tmp_path / "latin.xml"
    f.write_bytes((H200 / "nvidia-smi-q.xml").read_bytes().replace(b"NVIDIA H200", b"H\xe9200"))
    result = import_reports([f])
    assert not result.nodes
    assert "not valid UTF-8" in result.failed[0] and "invalid token" not in result.failed[0]


def test_newer_dtd_warns(tmp_path: Path) -> None:
    f = tmp_path / "v14.xml"
    f.write_text((H200 / "nvidia-smi-q.xml").read_text().replace("_v13.dtd", "_v14.dtd"))
    doc = invoke("inventory", *imports(f))
    assert any("nvsmi_device_v14.dtd is newer" in w for w in doc["import"]["warnings"])
    assert doc["nodes"][0]["gpus"]  # still imported


def test_status_and_health_judge_a_report_offline() -> None:
    st = invoke("status", *imports(OLD))
    b = st["nodes"][0]["gpus"][1]
    # a100x2-v11.xml GPU 1: HW slowdown + HW thermal slowdown, 1 volatile DBE
    assert set(b["clock_event_reasons_words"]) == {"HW slowdown", "HW thermal"}
    assert b["ecc_dbe_volatile"] == 1
    result = runner.invoke(app, ["health", *imports(OLD), "--json", "--exit-code"])
    assert result.exit_code == 2, result.output  # fail
    doc = json.loads(result.stdout)
    codes = {(f["gpu_index"], f["code"]) for f in doc["nodes"][0]["findings"]}
    assert (1, "ECC_DBE_VOLATILE") in codes
    assert not any(i == 0 for i, _ in codes)


def test_mig_plan_uses_the_imported_layout(tmp_path: Path) -> None:
    inv = tmp_path / "inv.json"
    result = runner.invoke(app, ["inventory", *imports(MIG), "--json"])
    assert result.exit_code == 0
    inv.write_text(result.stdout)
    same = invoke(
        "mig", "plan", "--inventory", str(inv), "--demand", "1 x 3g.71gb, 1 x 2g.35gb, 1 x 1g.18gb"
    )
    assert [g["repartition"] for g in same["exact"]["gpus"]] == [False]
    other = invoke("mig", "plan", "--inventory", str(inv), "--demand", "7 x 1g.18gb")
    assert [g["repartition"] for g in other["exact"]["gpus"]] == [True]
