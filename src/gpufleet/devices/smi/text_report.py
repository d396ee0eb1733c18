"""Reader of the plain-text ``nvidia-smi -q`` report: the same information as ``-q -x``, laid
out as indented ``Label : value`` lines under section headings (``GPU 00000000:00:06.0``,
``    FB Memory Usage``, ``        Total : 143771 MiB``).

The text is read into the element tree ``-q -x`` would have printed for the labels gpufleet
uses (:data:`GPU_LABELS`, label paths as printed by driver 580, and the older ``Clocks Throttle
Reasons``/``Power Readings``/absolute-threshold spellings), and that tree goes through the XML
parser, so both formats give the same records. Labels not in the table are ignored. Source of
the label/element pairs: the real H200 capture printed both ways
(``tests/fixtures/nvidia-h200/nvidia-smi-q.txt`` and ``nvidia-smi-q.xml``).
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

from gpufleet.devices.smi.xml_report import ROOT, SmiReport, parse_smi_tree
from gpufleet.errors import ParseError

_LINE = re.compile(r"^(?P<indent> *)(?P<label>[^:]*?)\s*(?::\s?(?P<value>.*))?$")
_GPU_HEADING = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])$")

TOP_LABELS: dict[str, str] = {
    "timestamp": "timestamp",
    "driver version": "driver_version",
    "cuda version": "cuda_version",
    "attached gpus": "attached_gpus",
}


def _reasons(section: str, element: str, prefix: str) -> dict[str, str]:
    pairs = {
        "idle": "gpu_idle",
        "applications clocks setting": "applications_clocks_setting",
        "sw power cap": "sw_power_cap",
        "hw slowdown": "hw_slowdown",
        "hw slowdown/hw thermal slowdown": "hw_thermal_slowdown",
        "hw slowdown/hw power brake slowdown": "hw_power_brake_slowdown",
        "sync boost": "sync_boost",
        "sw thermal slowdown": "sw_thermal_slowdown",
        "display clock setting": "display_clocks_setting",
    }
    return {f"{section}/{k}": f"{element}/{prefix}{v}" for k, v in pairs.items()}


def _ecc(kind: str) -> dict[str, str]:
    pairs = {
        "sram correctable": "sram_correctable",
        "sram uncorrectable": "sram_uncorrectable",
        "sram uncorrectable parity": "sram_uncorrectable_parity",
        "sram uncorrectable sec-ded": "sram_uncorrectable_secded",
        "dram correctable": "dram_correctable",
        "dram uncorrectable": "dram_uncorrectable",
        "single bit/total": "single_bit/total",
        "double bit/total": "double_bit/total",
    }
    return {f"ecc errors/{kind}/{k}": f"ecc_errors/{kind.lower()}/{v}" for k, v in pairs.items()}


def _power(section: str, element: str) -> dict[str, str]:
    pairs = {
        "power draw": "power_draw",
        "average power draw": "average_power_draw",
        "instantaneous power draw": "instant_power_draw",
        "current power limit": "current_power_limit",
        "power limit": "power_limit",
        "enforced power limit": "enforced_power_limit",
        "default power limit": "default_power_limit",
        "min power limit": "min_power_limit",
        "max power limit": "max_power_limit",
    }
    return {f"{section}/{k}": f"{element}/{v}" for k, v in pairs.items()}


_LINK = "pci/pci_gpu_link_info"
_COUNTERS = "clocks_event_reasons_counters"

# Label path (lower case, "/"-joined, below the GPU heading) -> element path in -q -x.
GPU_LABELS: dict[str, str] = {
    "product name": "product_name",
    "persistence mode": "persistence_mode",
    "mig mode/current": "mig_mode/current_mig",
    "mig mode/pending": "mig_mode/pending_mig",
    "serial number": "serial",
    "gpu uuid": "uuid",
    "minor number": "minor_number",
    "vbios version": "vbios_version",
    "inforom version/image version": "inforom_version/img_version",
    "inforom version/oem object": "inforom_version/oem_object",
    "pci/device id": "pci/pci_device_id",
    "pci/bus id": "pci/pci_bus_id",
    "pci/gpu link info/pcie generation/max": f"{_LINK}/pcie_gen/max_link_gen",
    "pci/gpu link info/pcie generation/current": f"{_LINK}/pcie_gen/current_link_gen",
    "pci/gpu link info/link width/max": f"{_LINK}/link_widths/max_link_width",
    "pci/gpu link info/link width/current": f"{_LINK}/link_widths/current_link_width",
    "pci/replays since reset": "pci/replay_counter",
    "pci/tx throughput": "pci/tx_util",
    "pci/rx throughput": "pci/rx_util",
    **_reasons("clocks event reasons", "clocks_event_reasons", "clocks_event_reason_"),
    **_reasons("clocks throttle reasons", "clocks_throttle_reasons", "clocks_throttle_reason_"),
    **{
        f"clocks event reasons counters/{label}": f"{_COUNTERS}/{_COUNTERS}_{suffix}"
        for label, suffix in (
            ("sw power capping", "sw_power_cap"),
            ("sync boost", "sync_boost"),
            ("sw thermal slowdown", "sw_therm_slowdown"),
            ("hw thermal slowdown", "hw_therm_slowdown"),
            ("hw power braking", "hw_power_brake"),
        )
    },
    "fb memory usage/total": "fb_memory_usage/total",
    "fb memory usage/reserved": "fb_memory_usage/reserved",
    "fb memory usage/used": "fb_memory_usage/used",
    "fb memory usage/free": "fb_memory_usage/free",
    "compute mode": "compute_mode",
    "utilization/gpu": "utilization/gpu_util",
    "utilization/memory": "utilization/memory_util",
    "utilization/encoder": "utilization/encoder_util",
    "utilization/decoder": "utilization/decoder_util",
    "ecc mode/current": "ecc_mode/current_ecc",
    "ecc mode/pending": "ecc_mode/pending_ecc",
    **_ecc("volatile"),
    **_ecc("aggregate"),
    "retired pages/single bit ecc": "retired_pages/multiple_single_bit_retirement/retired_count",
    "retired pages/double bit ecc": "retired_pages/double_bit_retirement/retired_count",
    "retired pages/pending page blacklist": "retired_pages/pending_retirement",
    "retired pages/pending": "retired_pages/pending_retirement",
    "remapped rows/correctable error": "remapped_rows/remapped_row_corr",
    "remapped rows/uncorrectable error": "remapped_rows/remapped_row_unc",
    "remapped rows/pending": "remapped_rows/remapped_row_pending",
    "remapped rows/remapping failure occurred": "remapped_rows/remapped_row_failure",
    "temperature/gpu current temp": "temperature/gpu_temp",
    "temperature/gpu t.limit temp": "temperature/gpu_temp_tlimit",
    "temperature/gpu shutdown t.limit temp": "temperature/gpu_temp_max_tlimit_threshold",
    "temperature/gpu slowdown t.limit temp": "temperature/gpu_temp_slow_tlimit_threshold",
    "temperature/gpu shutdown temp": "temperature/gpu_temp_max_threshold",
    "temperature/gpu slowdown temp": "temperature/gpu_temp_slow_threshold",
    "temperature/memory current temp": "temperature/memory_temp",
    **_power("gpu power readings", "gpu_power_readings"),
    **_power("power readings", "power_readings"),
    "clocks/graphics": "clocks/graphics_clock",
    "clocks/sm": "clocks/sm_clock",
    "clocks/memory": "clocks/mem_clock",
    "max clocks/sm": "max_clocks/sm_clock",
    "max clocks/memory": "max_clocks/mem_clock",
}

# Below a "MIG Device" heading (inside "MIG devices").
MIG_LABELS: dict[str, str] = {
    "index": "index",
    "gpu instance id": "gpu_instance_id",
    "compute instance id": "compute_instance_id",
    "device attributes/shared/multiprocessor count": (
        "device_attributes/shared/multiprocessor_count"
    ),
    "fb memory usage/total": "fb_memory_usage/total",
    "fb memory usage/used": "fb_memory_usage/used",
    "fb memory usage/free": "fb_memory_usage/free",
    "ecc errors/volatile/sram uncorrectable": "ecc_error_count/volatile_count/sram_uncorrectable",
}


@dataclass
class _Node:
    label: str
    value: str | None
    line: int
    children: list[_Node] = field(default_factory=list)


def looks_like_text_report(text: str) -> bool:
    """Whether ``text`` is ``nvidia-smi -q`` output (its banner, or its first label)."""
    head = text.lstrip()[:400]
    return "NVSMI LOG" in head or head.startswith("Timestamp")


def _tree(text: str, source: str) -> list[_Node]:
    roots: list[_Node] = []
    stack: list[tuple[int, _Node]] = []
    for n, raw in enumerate(text.splitlines(), start=1):
        line = raw.rstrip()
        if not line.strip() or line.strip().startswith("=="):
            continue
        m = _LINE.match(line)
        if m is None:  # pragma: no cover - the pattern matches any line
            raise ParseError(source, f"line {n}", "not a 'Label : value' line")
        indent = len(m["indent"])
        if _GPU_HEADING.match(line.strip()):
            node = _Node(line.strip(), None, n)
        else:
            value = m["value"].strip() if m["value"] is not None else None
            node = _Node(m["label"].strip(), value, n)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        (stack[-1][1].children if stack else roots).append(node)
        stack.append((indent, node))
    return roots


def _put(parent: ET.Element, path: str, value: str, line: int | None = None) -> None:
    """Set the element at ``path`` (created as needed); ``line`` is kept for error messages."""
    elem = parent
    for part in path.split("/"):
        child = elem.find(part)
        if child is None:
            child = ET.SubElement(elem, part)
        elem = child
    elem.text = value
    if line is not None:
        elem.set("line", str(line))


def _fill(elem: ET.Element, nodes: list[_Node], table: dict[str, str], prefix: str = "") -> None:
    for node in nodes:
        key = f"{prefix}{node.label.lower()}"
        if key == "mig devices":
            migs = ET.SubElement(elem, "mig_devices")
            for dev in node.children:
                if dev.label.lower() == "mig device":
                    _fill(ET.SubElement(migs, "mig_device"), dev.children, MIG_LABELS)
            continue
        if node.value is not None and key in table:
            _put(elem, table[key], node.value, node.line)
        if node.children:
            _fill(elem, node.children, table, f"{key}/")


def parse_smi_text(text: str, source: str = "<string>", *, tolerant: bool = False) -> SmiReport:
    """Parse ``nvidia-smi -q`` text into the same :class:`SmiReport` as the XML would give."""
    if not text.strip():
        raise ParseError(source, "document", "empty; expected the output of nvidia-smi -q")
    root = ET.Element(ROOT)
    found_gpu = False
    for node in _tree(text, source):
        heading = _GPU_HEADING.match(node.label) if node.value is None else None
        if heading is not None:
            gpu = ET.SubElement(root, "gpu", id=heading[1])
            _fill(gpu, node.children, GPU_LABELS)
            found_gpu = True
        elif node.value is not None and node.label.lower() in TOP_LABELS:
            _put(root, TOP_LABELS[node.label.lower()], node.value, node.line)
    if not found_gpu and root.find("attached_gpus") is None:
        raise ParseError(
            source, "document", "no 'GPU <bus id>' section: not the output of nvidia-smi -q"
        )
    return parse_smi_tree(root, source, dtd=None, tolerant=tolerant)
