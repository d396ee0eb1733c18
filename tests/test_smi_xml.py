"""nvidia-smi -q -x parser: the real H200 capture, multi-GPU, MIG, old DTD, N/A, broken input.

Expected values were read by hand from the fixture files (tests/fixtures/nvidia-h200/ and
tests/fixtures/smi/, see its README.md), not from the parser's output.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpufleet.devices.smi import (
    combine_mig_profiles,
    parse_mig_lgip,
    parse_mig_lgipp,
    parse_smi_xml,
    parse_smi_xml_file,
)
from gpufleet.devices.types import ClockEventReason
from gpufleet.errors import ParseError
from tests.h200_capture import assert_h200_idle_sample, assert_h200_info

FIX = Path(__file__).parent / "fixtures"
H200_DIR = FIX / "nvidia-h200"
H200_XML = H200_DIR / "nvidia-smi-q.xml"
MULTI = FIX / "smi" / "h200x8-v13.xml"
MIG = FIX / "smi" / "h200-mig-v12.xml"
OLD = FIX / "smi" / "a100x2-v11.xml"
MIB = 2**20


@pytest.fixture(scope="module")
def h200_text() -> str:
    return H200_XML.read_text()


def test_real_h200_report_header(h200_text: str) -> None:
    report = parse_smi_xml(h200_text, "nvidia-smi-q.xml")
    assert report.driver_version == "580.159.04"
    assert report.cuda_version == "13.0"
    assert report.attached_gpus == 1
    assert report.dtd == "nvsmi_device_v13.dtd"
    assert report.timestamp == "Mon Nov 30 14:56:06 2026"
    assert report.timestamp_s == datetime(2026, 11, 30, 14, 56, 6, tzinfo=UTC).timestamp()
    assert len(report.gpus) == 1


def test_real_h200_device_info(h200_text: str) -> None:
    info = parse_smi_xml(h200_text).gpus[0].info
    assert_h200_info(info)
    assert info.cuda_driver_version == "13.0"
    assert info.minor_number == 0
    # -2 C / -8 C are offsets from T.Limit (35 C + 52 C margin): the thresholds are exactly what
    # NVML's nvmlDeviceGetTemperatureThreshold answered on the same GPU (nvml_probe.json)
    probe = json.loads((H200_DIR / "nvml_probe.json").read_text())
    thresholds = probe["devices"][0]["nvmlDeviceGetTemperatureThreshold"]
    assert (
        info.slowdown_temp_c == thresholds["(1,)"]["value"]
    )  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    assert (
        info.shutdown_temp_c == thresholds["(0,)"]["value"]
    )  # NVML_TEMPERATURE_THRESHOLD_SHUTDOWN


def test_real_h200_sample(h200_text: str) -> None:
    gpu = parse_smi_xml(h200_text).gpus[0]
    s = gpu.sample
    assert s.timestamp_s == datetime(2026, 11, 30, 14, 56, 6, tzinfo=UTC).timestamp()
    assert_h200_idle_sample(s)
    assert s.power_w == pytest.approx(79.60)
    assert s.clock_event_reasons == ClockEventReason.GPU_IDLE
    assert s.pcie_replay_count == 0
    assert s.pcie_tx_bytes_per_s == 1005 * 1024
    assert s.pcie_rx_bytes_per_s == 597 * 1024
    # retired_pages are N/A on this GPU (it remaps rows instead)
    assert (s.retired_pages_sbe, s.retired_pages_dbe, s.retired_pages_pending) == (None,) * 3
    assert gpu.mig_devices == ()


@pytest.mark.parametrize(
    "spelling",
    [
        "N/A",
        "[N/A]",
        "Not Supported",
        "[Not Supported]",
        "Requested functionality has been deprecated",
        "",
        "  ",
    ],
)
def test_not_available_spellings_become_none(h200_text: str, spelling: str) -> None:
    text = h200_text.replace("<gpu_temp>35 C</gpu_temp>", f"<gpu_temp>{spelling}</gpu_temp>")
    text = text.replace("<vbios_version>96.00.A5.00.1A<", f"<vbios_version>{spelling}<")
    text = text.replace(
        "<current_ecc>Enabled</current_ecc>", f"<current_ecc>{spelling}</current_ecc>"
    )
    gpu = parse_smi_xml(text).gpus[0]
    assert gpu.sample.gpu_temp_c is None
    assert gpu.info.vbios_version is None
    assert gpu.info.ecc_current is None
    assert gpu.sample.mem_temp_c == 39.0  # neighbours untouched


def test_unknown_elements_are_ignored(h200_text: str) -> None:
    extra = "<future_block><thing>12x</thing><nested><x>?</x></nested></future_block>"
    text = h200_text.replace("<serial>", extra + "<serial>").replace(
        "<attached_gpus>", "<future_top>yes</future_top><attached_gpus>"
    )
    assert parse_smi_xml(text).gpus == parse_smi_xml(h200_text).gpus


def test_multi_gpu_document() -> None:
    report = parse_smi_xml_file(MULTI)
    assert report.attached_gpus == 8
    infos = report.devices
    assert [i.index for i in infos] == list(range(8))
    assert len({i.uuid for i in infos}) == 8
    assert [i.pci_bus_id for i in infos] == [
        f"00000000:{b}:00.0" for b in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
    ]
    assert all(i.model == "h200-sxm" for i in infos)
    assert infos[3].pcie_gen_current == 4 and infos[3].pcie_gen_max == 5
    assert infos[5].pcie_width_current == 8 and infos[5].pcie_width_max == 16
    assert infos[6].vbios_version == "96.00.A5.00.19"
    assert {i.vbios_version for i in infos[:6]} == {"96.00.A5.00.1A"}
    s2 = report.gpus[2].sample
    assert (s2.ecc_sbe_volatile, s2.ecc_sbe_aggregate, s2.remapped_rows_correctable) == (3, 12, 1)
    s4 = report.gpus[4].sample
    assert s4.clock_event_reasons == ClockEventReason.SW_POWER_CAP
    assert s4.power_w == pytest.approx(699.12)
    assert s4.sm_clock_mhz == 1470
    assert [g.sample.gpu_temp_c for g in report.gpus] == [33.0 + i for i in range(8)]
    node = report.node_inventory()
    assert node.name == "h200x8-v13"
    assert node.source == str(MULTI)
    assert len(node.gpus) == 8 and node.driver_version == "580.159.04"


def test_mig_enabled_document_v12() -> None:
    report = parse_smi_xml_file(MIG)
    assert report.dtd == "nvsmi_device_v12.dtd"
    assert report.driver_version == "550.90.07"
    gpu = report.gpus[0]
    assert (gpu.info.mig_current, gpu.info.mig_pending) == (True, True)
    assert gpu.sample.gpu_util_pct is None  # N/A with MIG on
    assert gpu.sample.power_w == pytest.approx(81.27)  # v12 <power_draw>
    assert gpu.info.power_limit_enforced_w == 700.0
    migs = gpu.mig_devices
    assert [m.index for m in migs] == [0, 1, 2]
    assert [m.gpu_instance_id for m in migs] == [1, 5, 13]
    assert [m.compute_instance_id for m in migs] == [0, 0, 0]
    assert [m.sm_count for m in migs] == [60, 32, 16]
    assert [m.memory_total_bytes for m in migs] == [71424 * MIB, 33280 * MIB, 16384 * MIB]
    assert [m.memory_used_bytes for m in migs] == [1024 * MIB, 37 * MIB, 22 * MIB]
    # the XML does not name profiles: inferred from memory and SMs (README of tests/fixtures/smi)
    assert [m.profile_name for m in migs] == ["3g.71gb", "2g.35gb", "1g.18gb"]
    assert all(m.placement_start is None for m in migs)  # nvidia-smi -q prints no placement
    assert [m.ecc_sram_uncorrectable_volatile for m in migs] == [0, 0, 0]
    assert gpu.sample.mem_used_bytes == (1024 + 37 + 22) * MIB


def test_mig_devices_match_the_h200_profiles() -> None:
    lgip = parse_mig_lgip((FIX / "nvidia-h200" / "nvidia-smi-mig-lgip.txt").read_text())
    lgipp = parse_mig_lgipp((FIX / "nvidia-h200" / "nvidia-smi-mig-lgipp.txt").read_text())
    # 1g.18gb+me has the same shape as 1g.18gb plus the media engines: leave it out
    by_shape: dict[tuple[int | None, int | None], str] = {
        (p.sm_count, p.memory_mib): p.name
        for p in combine_mig_profiles(lgip, lgipp)
        if not p.media_extensions
    }
    migs = parse_smi_xml_file(MIG).gpus[0].mig_devices
    names = [by_shape.get((m.sm_count, (m.memory_total_bytes or 0) // MIB)) for m in migs]
    assert names == ["3g.71gb", "2g.35gb", "1g.18gb"]


def test_old_dtd_v11_document() -> None:
    report = parse_smi_xml_file(OLD)
    assert report.dtd == "nvsmi_device_v11.dtd"
    assert (report.driver_version, report.cuda_version) == ("470.82.01", "11.4")
    a, b = report.gpus
    assert a.info.name == "NVIDIA A100-SXM4-80GB"
    assert a.info.pci_device_id == "0x20B210DE"
    assert a.info.memory_total_bytes == 81251 * MIB
    assert (a.info.pcie_gen_current, a.info.pcie_width_max) == (4, 16)
    # <power_readings> with power_limit / enforced_power_limit
    assert a.info.power_limit_enforced_w == 400.0
    assert (a.info.power_limit_min_w, a.info.power_limit_max_w) == (100.0, 400.0)
    assert a.sample.power_w == pytest.approx(62.14)
    # absolute thresholds in this DTD
    assert (a.info.slowdown_temp_c, a.info.shutdown_temp_c) == (89, 92)
    assert a.info.inforom_version == "G506.0212.00.02"
    assert a.sample.mem_reserved_bytes is None  # v11 has no <reserved>
    # clocks_throttle_reasons: idle on the first, HW slowdown + HW thermal on the second
    assert a.sample.clock_event_reasons == 0x1
    assert b.sample.clock_event_reasons == 0x8 | 0x40
    # single_bit/double_bit totals
    assert (b.sample.ecc_sbe_volatile, b.sample.ecc_dbe_volatile) == (5, 1)
    assert (b.sample.ecc_sbe_aggregate, b.sample.ecc_dbe_aggregate) == (27, 1)
    assert (b.sample.remapped_rows_correctable, b.sample.remapped_rows_uncorrectable) == (2, 1)
    assert b.sample.remap_pending is True
    assert b.sample.pcie_replay_count == 17
    assert b.info.minor_number == 1


def test_unreadable_timestamp_is_not_fatal(h200_text: str) -> None:
    text = h200_text.replace("Mon Nov 30 14:56:06 2026", "lun. 30 nov. 2026 14:56:06")
    report = parse_smi_xml(text)
    assert report.timestamp == "lun. 30 nov. 2026 14:56:06"
    assert report.timestamp_s is None
    assert report.gpus[0].sample.timestamp_s == 0.0


def test_remapped_rows_na_block(h200_text: str) -> None:
    text = re.sub(
        r"<remapped_rows>[\s\S]*?</remapped_rows>", "<remapped_rows>N/A</remapped_rows>", h200_text
    )
    s = parse_smi_xml(text).gpus[0].sample
    assert (s.remapped_rows_correctable, s.remap_pending) == (None, None)


def test_ecc_sums_new_schema(h200_text: str) -> None:
    # volatile block comes first; put SRAM 2 + DRAM 5 corrected, parity 1 + secded 2 + DRAM 4
    text = h200_text
    for tag, value in (
        ("sram_correctable", 2),
        ("sram_uncorrectable_parity", 1),
        ("sram_uncorrectable_secded", 2),
        ("dram_correctable", 5),
        ("dram_uncorrectable", 4),
    ):
        text = text.replace(f"<{tag}>0</{tag}>", f"<{tag}>{value}</{tag}>", 1)
    s = parse_smi_xml(text).gpus[0].sample
    assert (s.ecc_sbe_volatile, s.ecc_dbe_volatile) == (7, 7)
    assert (s.ecc_sbe_aggregate, s.ecc_dbe_aggregate) == (0, 0)


# ---------------------------------------------------------------- broken documents


def _err(text: str, source: str = "node7.xml") -> ParseError:
    with pytest.raises(ParseError) as info:
        parse_smi_xml(text, source)
    return info.value


def test_not_xml() -> None:
    err = _err("GPU 0: NVIDIA H200 (UUID: GPU-a9be...)\n")
    assert err.source == "node7.xml"
    assert "line 1" in err.where
    assert "not well-formed XML" in err.problem


def test_truncated_xml(h200_text: str) -> None:
    err = _err(h200_text[: len(h200_text) // 2])
    assert "not well-formed XML" in str(err) and str(err).startswith("node7.xml: line ")


def test_empty_document() -> None:
    assert "empty" in _err("  \n").problem


def test_wrong_root() -> None:
    err = _err("<?xml version='1.0'?><nvidia_smi_device><gpu/></nvidia_smi_device>")
    assert err.where == "<nvidia_smi_device>"
    assert "nvidia_smi_log" in err.problem


def test_gpu_without_uuid(h200_text: str) -> None:
    text = re.sub(r"<uuid>[^<]*</uuid>", "", h200_text)
    err = _err(text)
    assert err.where == "gpu[0]/uuid"
    assert "missing" in err.problem


def test_bad_number_names_the_element() -> None:
    text = MULTI.read_text()
    first = text.index("<gpu id=", text.index("<gpu id=") + 1)  # the second GPU
    total = text.index("<total>143771 MiB</total>", first)
    text = (
        text[:total] + "<total>12x MiB</total>" + text[total + len("<total>143771 MiB</total>") :]
    )
    err = _err(text, "h200x8.xml")
    assert str(err) == "h200x8.xml: gpu[1]/fb_memory_usage/total: '12x MiB' is not a number"


def test_wrong_unit_is_an_error(h200_text: str) -> None:
    text = h200_text.replace("<max_power_limit>700.00 W<", "<max_power_limit>0.70 kW<")
    err = _err(text)
    assert err.where == "gpu[0]/gpu_power_readings/max_power_limit"
    assert "unit 'kW'" in err.problem


def test_bad_switch_and_width(h200_text: str) -> None:
    err = _err(h200_text.replace("<persistence_mode>Enabled<", "<persistence_mode>Maybe<"))
    assert err.where == "gpu[0]/persistence_mode"
    err = _err(h200_text.replace("<max_link_width>16x<", "<max_link_width>sixteen<"))
    assert err.where == "gpu[0]/pci/pci_gpu_link_info/link_widths/max_link_width"


def test_bad_mig_device_value() -> None:
    text = MIG.read_text().replace(
        "<gpu_instance_id>5</gpu_instance_id>", "<gpu_instance_id>five</gpu_instance_id>"
    )
    err = _err(text)
    assert err.where == "gpu[0]/mig_devices/mig_device[1]/gpu_instance_id"


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ParseError) as info:
        parse_smi_xml_file(tmp_path / "nope.xml")
    assert info.value.source.endswith("nope.xml")
