"""Parser of ``nvidia-smi -q -x`` (the XML device report) into gpufleet's device records.

Reads the DTD versions seen in the field: ``nvsmi_device_v11`` (``clocks_throttle_reasons``,
``power_readings`` with ``power_draw``/``power_limit``/``enforced_power_limit``, ECC counts as
``single_bit``/``double_bit`` totals, absolute slowdown/shutdown temperatures), ``v12`` and ``v13``
(``clocks_event_reasons``, ``gpu_power_readings`` with ``current_power_limit`` and, on v13,
``average_power_draw``/``instant_power_draw``, ECC as ``sram_*``/``dram_*`` counts, thresholds
relative to T.Limit). Unknown elements are ignored; a malformed document raises
:class:`gpufleet.errors.ParseError` naming the file and the element path, e.g.
``gpu[1]/fb_memory_usage/total: '12x MiB' is not a number``. ``gpu[i]`` counts ``<gpu>``
elements from 0 in document order, which is also the ``index`` given to the GPU.

Temperatures: ``gpu_temp_slow_threshold``/``gpu_temp_max_threshold`` (v11, v12 on older GPUs) are
absolute and become ``slowdown_temp_c``/``shutdown_temp_c``. Newer drivers report
``gpu_temp_slow_tlimit_threshold``/``gpu_temp_max_tlimit_threshold`` as offsets from the GPU's
T.Limit (``-2 C``, ``-8 C`` on the H200 capture) and ``gpu_temp_tlimit`` as the margin between the
current temperature and T.Limit, so a threshold is ``gpu_temp + gpu_temp_tlimit - offset``
(35 + 52 + 2 = 89 C and 35 + 52 + 8 = 95 C on the H200 capture, exactly what NVML's
``nvmlDeviceGetTemperatureThreshold`` answered on the same GPU, ``nvml_probe.json``). A negative
"absolute" threshold without those readings stays ``None``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from calendar import timegm
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

from gpufleet.devices.smi.values import (
    MIB,
    Where,
    clean,
    integer,
    link_width,
    number,
    pci_device_id,
    switch,
)
from gpufleet.devices.types import ClockEventReason, DeviceInfo, NodeInventory, Sample
from gpufleet.errors import ParseError

ROOT = "nvidia_smi_log"

# Element suffix of each clock-event reason -> NVML bit (nvmlClocksEventReason*; NVML API
# Reference, "Clocks Event Reasons"). v11 spells the prefix clocks_throttle_reason_.
_REASON_BITS: dict[str, ClockEventReason] = {
    "gpu_idle": ClockEventReason.GPU_IDLE,
    "applications_clocks_setting": ClockEventReason.APPLICATIONS_CLOCKS_SETTING,
    "sw_power_cap": ClockEventReason.SW_POWER_CAP,
    "hw_slowdown": ClockEventReason.HW_SLOWDOWN,
    "sync_boost": ClockEventReason.SYNC_BOOST,
    "sw_thermal_slowdown": ClockEventReason.SW_THERMAL_SLOWDOWN,
    "hw_thermal_slowdown": ClockEventReason.HW_THERMAL_SLOWDOWN,
    "hw_power_brake_slowdown": ClockEventReason.HW_POWER_BRAKE_SLOWDOWN,
    "display_clocks_setting": ClockEventReason.DISPLAY_CLOCK_SETTING,
}
_REASON_BLOCKS = (
    ("clocks_event_reasons", "clocks_event_reason_"),
    ("clocks_throttle_reasons", "clocks_throttle_reason_"),
)

# nvidia-smi prints PCIe throughput in KB/s from nvmlDeviceGetPcieThroughput, whose unit NVML
# documents as KB/s; read here as 1024 bytes.
_KB = 1024


@dataclass(frozen=True)
class MigDevice:
    """One MIG device (a compute instance inside a GPU instance) listed under ``mig_devices``."""

    index: int
    gpu_instance_id: int | None
    compute_instance_id: int | None
    profile_name: str | None = None
    sm_count: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_free_bytes: int | None = None
    ecc_sram_uncorrectable_volatile: int | None = None
    # Where the GPU instance sits (start memory slice, slices spanned): nvidia-smi -q does not
    # print it (``nvidia-smi mig -lgi`` does), so None unless the document carries it.
    placement_start: int | None = None
    placement_size: int | None = None


@dataclass(frozen=True)
class SmiGpu:
    """One ``<gpu>`` of the report: what it is, what it read, its MIG devices, and the
    clock-event reason time counters (``clocks_event_reasons_counters``, microseconds since
    the driver loaded, keyed by the element's suffix: ``sw_power_cap``, ...)."""

    info: DeviceInfo
    sample: Sample
    mig_devices: tuple[MigDevice, ...] = ()
    clock_event_counters_us: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class SmiReport:
    """A parsed ``nvidia-smi -q -x`` document."""

    source: str
    driver_version: str | None
    cuda_version: str | None
    timestamp: str | None  # as printed, host local time, e.g. "Mon Nov 30 14:56:06 2026"
    timestamp_s: float | None  # that time read as UTC seconds (the document has no zone)
    attached_gpus: int | None
    dtd: str | None  # e.g. "nvsmi_device_v13.dtd"
    gpus: tuple[SmiGpu, ...]
    # GPUs that could not be read (lost, no UUID, a malformed value), one message each; only
    # filled by the tolerant parse (``parse_smi_xml(..., tolerant=True)``).
    unreadable: tuple[str, ...] = ()

    @property
    def devices(self) -> tuple[DeviceInfo, ...]:
        return tuple(g.info for g in self.gpus)

    @property
    def samples(self) -> tuple[Sample, ...]:
        return tuple(g.sample for g in self.gpus)

    def node_inventory(self, name: str | None = None) -> NodeInventory:
        """This report as one node's inventory (``inventory --import``); name defaults to the
        file's stem."""
        node = name if name is not None else Path(self.source).stem
        return NodeInventory(
            name=node,
            gpus=self.devices,
            source=self.source,
            driver_version=self.driver_version,
            cuda_driver_version=self.cuda_version,
        )


class _Gpu:
    """Typed accessors over one element, with paths for error messages."""

    def __init__(self, elem: ET.Element, path: str, source: str) -> None:
        self.elem = elem
        self.path = path
        self.source = source

    def where(self, sub: str) -> Where:
        place = f"{self.path}/{sub}" if self.path else sub
        found = self.elem.find(sub) if sub else None
        line = found.get("line") if found is not None else None  # text reports keep it
        return Where(self.source, f"line {line}, {place}" if line else place)

    def text(self, sub: str) -> str | None:
        found = self.elem.find(sub)
        if found is None:
            return None
        if len(found):  # has children: not a leaf value
            return None
        return clean(found.text)

    def first_text(self, *subs: str) -> tuple[str | None, str]:
        """The first of ``subs`` that has a value, and its path (the first path if none)."""
        for sub in subs:
            value = self.text(sub)
            if value is not None:
                return value, sub
        return None, subs[0]

    def int_(self, sub: str, *units: str) -> int | None:
        return integer(self.text(sub), self.where(sub), units)

    def float_(self, sub: str, *units: str) -> float | None:
        return number(self.text(sub), self.where(sub), units)

    def first_float(self, subs: tuple[str, ...], *units: str) -> float | None:
        value, sub = self.first_text(*subs)
        return number(value, self.where(sub), units)

    def bool_(self, sub: str) -> bool | None:
        return switch(self.text(sub), self.where(sub))

    def mib(self, sub: str) -> int | None:
        value = self.int_(sub, "MiB")
        return None if value is None else value * MIB


def parse_smi_xml(text: str, source: str = "<string>", *, tolerant: bool = False) -> SmiReport:
    """Parse the text of ``nvidia-smi -q -x``; ``source`` names the file in error messages.

    A GPU that cannot be read (``GPU is lost``, ``[Unknown Error]`` as UUID, a malformed value)
    raises ParseError, or with ``tolerant`` is left out and listed in ``SmiReport.unreadable``.
    """
    if not text.strip():
        raise ParseError(source, "document", "empty; expected the output of nvidia-smi -q -x")
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        line, col = exc.position  # expat counts columns from 0
        reason = re.sub(r": line \d+, column \d+$", "", str(exc))
        raise ParseError(
            source, f"line {line}, column {col + 1}", f"not well-formed XML ({reason})"
        ) from None
    return parse_smi_tree(root, source, dtd=_dtd(text), tolerant=tolerant)


def parse_smi_tree(
    root: ET.Element, source: str, *, dtd: str | None = None, tolerant: bool = False
) -> SmiReport:
    """A report from an ``<nvidia_smi_log>`` element (the XML, or the text report read into
    the same tree by :mod:`gpufleet.devices.smi.text_report`)."""
    if root.tag != ROOT:
        raise ParseError(
            source, f"<{root.tag}>", f"root element must be <{ROOT}> (nvidia-smi -q -x)"
        )
    top = _Gpu(root, "", source)
    driver = top.text("driver_version")
    cuda = top.text("cuda_version")
    stamp = top.text("timestamp")
    stamp_s = _xml_time(stamp)
    gpus: list[SmiGpu] = []
    unreadable: list[str] = []
    for i, g in enumerate(root.findall("gpu")):
        one = _Gpu(g, f"gpu[{i}]", source)
        try:
            lost = _lost_reason(g)
            if lost is not None:
                raise Where(source, one.path).error(lost)
            gpus.append(_gpu(one, i, driver, cuda, stamp_s))
        except ParseError as exc:
            if not tolerant:
                raise
            bus = g.get("id") or one.text("pci/pci_bus_id") or "?"
            unreadable.append(f"{exc.where} ({bus}): {exc.problem}")
    return SmiReport(
        source=source,
        driver_version=driver,
        cuda_version=cuda,
        timestamp=stamp,
        timestamp_s=stamp_s,
        attached_gpus=top.int_("attached_gpus"),
        dtd=dtd,
        gpus=tuple(gpus),
        unreadable=tuple(unreadable),
    )


def _lost_reason(g: ET.Element) -> str | None:
    """Why a ``<gpu>`` cannot be read at all: nvidia-smi prints ``GPU is lost`` in its values
    when the GPU fell off the bus (XID 79), and ``Unknown Error`` in place of its UUID when the
    driver cannot talk to it."""
    for elem in g.iter():
        if elem.text and "gpu is lost" in elem.text.lower():
            return "GPU is lost (fallen off the bus): nothing read from it"
    uuid = g.find("uuid")
    if uuid is not None and uuid.text is not None and clean(uuid.text) is None:
        return f"uuid is {uuid.text.strip()!r}: the driver could not read this GPU"
    return None


def parse_smi_xml_file(path: str | Path) -> SmiReport:
    """Read and parse one ``nvidia-smi -q -x`` file; unreadable files raise ParseError too."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ParseError(str(p), "file", f"cannot be read ({exc.strerror or exc})") from None
    return parse_smi_xml(text, str(p))


def _dtd(text: str) -> str | None:
    head = text[:512]
    marker = 'SYSTEM "'
    at = head.find(marker)
    if at < 0:
        return None
    end = head.find('"', at + len(marker))
    return head[at + len(marker) : end] if end > 0 else None


def _xml_time(stamp: str | None) -> float | None:
    """The report's time (``Mon Nov 30 14:56:06 2026``, C locale) read as UTC; ``None`` when it
    is printed some other way (the time is informative: no reason to reject the document)."""
    if stamp is None:
        return None
    try:
        parsed = datetime.strptime(stamp, "%a %b %d %H:%M:%S %Y")
    except ValueError:
        return None
    return float(timegm(parsed.timetuple()))


def _gpu(
    g: _Gpu, index: int, driver: str | None, cuda: str | None, stamp_s: float | None
) -> SmiGpu:
    uuid = g.text("uuid")
    if uuid is None:
        raise g.where("uuid").error("missing: every GPU must have a uuid")
    name = g.text("product_name")
    if name is None:
        raise g.where("product_name").error("missing: every GPU must have a product name")
    info = _device_info(g, index, uuid, name, driver, cuda)
    sample = _sample(g, stamp_s)
    return SmiGpu(
        info=info,
        sample=sample,
        mig_devices=_mig_devices(g, info.model),
        clock_event_counters_us=_reason_counters(g),
    )


def _model_key(name: str, pci_id: str | None) -> str | None:
    from gpufleet.catalog import load_catalog

    model = load_catalog().gpu_by_nvml_name(name, pci_id)
    return model.key if model is not None else None


def _power_block(g: _Gpu) -> str:
    """``gpu_power_readings`` (v12+) or ``power_readings`` (v11 and older)."""
    return (
        "gpu_power_readings" if g.elem.find("gpu_power_readings") is not None else "power_readings"
    )


def _device_info(
    g: _Gpu, index: int, uuid: str, name: str, driver: str | None, cuda: str | None
) -> DeviceInfo:
    pci_id = pci_device_id(g.text("pci/pci_device_id"))
    pw = _power_block(g)
    link = "pci/pci_gpu_link_info"
    inforom, _ = g.first_text("inforom_version/img_version", "inforom_version/oem_object")
    return DeviceInfo(
        index=index,
        uuid=uuid,
        name=name,
        model=_model_key(name, pci_id),
        pci_bus_id=g.text("pci/pci_bus_id") or g.elem.get("id"),
        pci_device_id=pci_id,
        serial=g.text("serial"),
        vbios_version=g.text("vbios_version"),
        inforom_version=inforom,
        driver_version=driver,
        cuda_driver_version=cuda,
        memory_total_bytes=g.mib("fb_memory_usage/total"),
        power_limit_default_w=g.float_(f"{pw}/default_power_limit", "W"),
        power_limit_min_w=g.float_(f"{pw}/min_power_limit", "W"),
        power_limit_max_w=g.float_(f"{pw}/max_power_limit", "W"),
        power_limit_enforced_w=g.first_float(
            (f"{pw}/current_power_limit", f"{pw}/enforced_power_limit"), "W"
        ),
        max_sm_clock_mhz=g.int_("max_clocks/sm_clock", "MHz"),
        max_mem_clock_mhz=g.int_("max_clocks/mem_clock", "MHz"),
        pcie_gen_current=g.int_(f"{link}/pcie_gen/current_link_gen"),
        pcie_gen_max=g.int_(f"{link}/pcie_gen/max_link_gen"),
        pcie_width_current=link_width(
            g.text(f"{link}/link_widths/current_link_width"),
            g.where(f"{link}/link_widths/current_link_width"),
        ),
        pcie_width_max=link_width(
            g.text(f"{link}/link_widths/max_link_width"),
            g.where(f"{link}/link_widths/max_link_width"),
        ),
        persistence_mode=g.bool_("persistence_mode"),
        ecc_current=g.bool_("ecc_mode/current_ecc"),
        ecc_pending=g.bool_("ecc_mode/pending_ecc"),
        mig_current=g.bool_("mig_mode/current_mig"),
        mig_pending=g.bool_("mig_mode/pending_mig"),
        compute_mode=g.text("compute_mode"),
        slowdown_temp_c=_absolute_temp(g, "temperature/gpu_temp_slow_threshold")
        or _tlimit_temp(g, "temperature/gpu_temp_slow_tlimit_threshold"),
        shutdown_temp_c=_absolute_temp(g, "temperature/gpu_temp_max_threshold")
        or _tlimit_temp(g, "temperature/gpu_temp_max_tlimit_threshold"),
        minor_number=g.int_("minor_number"),
    )


def _absolute_temp(g: _Gpu, sub: str) -> int | None:
    """An absolute threshold temperature; negative values are T.Limit offsets -> None."""
    value = g.int_(sub, "C")
    return value if value is not None and value > 0 else None


def _tlimit_temp(g: _Gpu, offset_path: str) -> int | None:
    """A threshold given as an offset from T.Limit: T.Limit is the current temperature plus the
    reported margin (``gpu_temp_tlimit``); the threshold lies ``-offset`` C beyond it."""
    offset = g.int_(offset_path, "C")
    temp = g.int_("temperature/gpu_temp", "C")
    margin = g.int_("temperature/gpu_temp_tlimit", "C")
    if offset is None or temp is None or margin is None:
        return None
    return temp + margin - offset


def _sample(g: _Gpu, stamp_s: float | None) -> Sample:
    pw = _power_block(g)
    tx = g.float_("pci/tx_util", "KB/s")
    rx = g.float_("pci/rx_util", "KB/s")
    sbe_v, dbe_v = _ecc_totals(g, "volatile")
    sbe_a, dbe_a = _ecc_totals(g, "aggregate")
    return Sample(
        timestamp_s=stamp_s if stamp_s is not None else 0.0,  # 0.0: the report had no time
        gpu_util_pct=g.float_("utilization/gpu_util", "%"),
        mem_util_pct=g.float_("utilization/memory_util", "%"),
        enc_util_pct=g.float_("utilization/encoder_util", "%"),
        dec_util_pct=g.float_("utilization/decoder_util", "%"),
        mem_used_bytes=g.mib("fb_memory_usage/used"),
        mem_free_bytes=g.mib("fb_memory_usage/free"),
        mem_reserved_bytes=g.mib("fb_memory_usage/reserved"),
        gpu_temp_c=g.float_("temperature/gpu_temp", "C"),
        mem_temp_c=g.float_("temperature/memory_temp", "C"),
        power_w=g.first_float(
            (f"{pw}/power_draw", f"{pw}/average_power_draw", f"{pw}/instant_power_draw"), "W"
        ),
        power_instant_w=g.float_(f"{pw}/instant_power_draw", "W"),
        sm_clock_mhz=g.int_("clocks/sm_clock", "MHz"),
        mem_clock_mhz=g.int_("clocks/mem_clock", "MHz"),
        clock_event_reasons=_reasons(g),
        pcie_replay_count=g.int_("pci/replay_counter"),
        pcie_tx_bytes_per_s=None if tx is None else tx * _KB,
        pcie_rx_bytes_per_s=None if rx is None else rx * _KB,
        ecc_sbe_volatile=sbe_v,
        ecc_dbe_volatile=dbe_v,
        ecc_sbe_aggregate=sbe_a,
        ecc_dbe_aggregate=dbe_a,
        remapped_rows_correctable=g.int_("remapped_rows/remapped_row_corr"),
        remapped_rows_uncorrectable=g.int_("remapped_rows/remapped_row_unc"),
        remap_pending=g.bool_("remapped_rows/remapped_row_pending"),
        remap_failure=g.bool_("remapped_rows/remapped_row_failure"),
        retired_pages_sbe=g.int_("retired_pages/multiple_single_bit_retirement/retired_count"),
        retired_pages_dbe=g.int_("retired_pages/double_bit_retirement/retired_count"),
        retired_pages_pending=g.bool_("retired_pages/pending_retirement"),
    )


def _reasons(g: _Gpu) -> int | None:
    """The active clock-event reasons as the NVML bitmask; None when the report has none."""
    for block, prefix in _REASON_BLOCKS:
        elem = g.elem.find(block)
        if elem is None:
            continue
        mask = 0
        seen = False
        for child in elem:
            if not child.tag.startswith(prefix):
                continue
            bit = _REASON_BITS.get(child.tag.removeprefix(prefix))
            if bit is None:
                continue  # a reason gpufleet does not know: ignored
            active = switch(child.text, g.where(f"{block}/{child.tag}"))
            if active is None:
                continue
            seen = True
            if active:
                mask |= int(bit)
        return mask if seen else None
    return None


def _ecc_totals(g: _Gpu, kind: str) -> tuple[int | None, int | None]:
    """(corrected, uncorrected) ECC totals of ``volatile`` or ``aggregate``.

    v11: ``single_bit/total`` and ``double_bit/total``. v12/v13: the sum of ``sram_correctable``
    and ``dram_correctable``; of ``sram_uncorrectable`` (or its ``_parity`` + ``_secded`` split)
    and ``dram_uncorrectable`` - the same totals ``ecc.errors.*.total`` gives in CSV.
    """
    base = f"ecc_errors/{kind}"
    if (
        g.elem.find(f"{base}/single_bit") is not None
        or g.elem.find(f"{base}/double_bit") is not None
    ):
        return g.int_(f"{base}/single_bit/total"), g.int_(f"{base}/double_bit/total")
    corrected = _sum(g, base, ("sram_correctable", "dram_correctable"))
    if g.text(f"{base}/sram_uncorrectable") is not None:
        unc_parts: tuple[str, ...] = ("sram_uncorrectable", "dram_uncorrectable")
    else:
        unc_parts = ("sram_uncorrectable_parity", "sram_uncorrectable_secded", "dram_uncorrectable")
    return corrected, _sum(g, base, unc_parts)


def _sum(g: _Gpu, base: str, parts: tuple[str, ...]) -> int | None:
    values = [g.int_(f"{base}/{p}") for p in parts]
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _reason_counters(g: _Gpu) -> dict[str, int]:
    """``clocks_event_reasons_counters`` (v13: time each reason held the clocks down, in us)."""
    block = "clocks_event_reasons_counters"
    out: dict[str, int] = {}
    elem = g.elem.find(block)
    if elem is None:
        return out
    for child in elem:
        value = integer(child.text, g.where(f"{block}/{child.tag}"), ("us",))
        if value is not None:
            out[child.tag.removeprefix(f"{block}_")] = value
    return out


def _mig_devices(g: _Gpu, model: str | None) -> tuple[MigDevice, ...]:
    out: list[MigDevice] = []
    for i, elem in enumerate(g.elem.findall("mig_devices/mig_device")):
        m = _Gpu(elem, f"{g.path}/mig_devices/mig_device[{i}]", g.source)
        index = m.int_("index")
        profile = m.text("profile_name") or m.text("name")
        if profile is not None:
            profile = profile.removeprefix("MIG ").strip()
        out.append(
            MigDevice(
                index=index if index is not None else i,
                gpu_instance_id=m.int_("gpu_instance_id"),
                compute_instance_id=m.int_("compute_instance_id"),
                profile_name=profile,
                sm_count=m.int_("device_attributes/shared/multiprocessor_count"),
                memory_total_bytes=m.mib("fb_memory_usage/total"),
                memory_used_bytes=m.mib("fb_memory_usage/used"),
                memory_free_bytes=m.mib("fb_memory_usage/free"),
                ecc_sram_uncorrectable_volatile=m.int_(
                    "ecc_error_count/volatile_count/sram_uncorrectable"
                ),
                placement_start=m.int_("placement/start"),
                placement_size=m.int_("placement/size"),
            )
        )
    return infer_mig_profiles(tuple(out), model)


def infer_mig_profiles(devices: tuple[MigDevice, ...], model: str | None) -> tuple[MigDevice, ...]:
    """Name each MIG device's GPU-instance profile from the catalog's geometry of ``model``.

    nvidia-smi -q lists MIG devices (compute instances) with their memory and SM count but not
    the profile. A GPU instance's memory is that of exactly one memory size in the profile
    table (``nvidia-smi mig -lgip``); among profiles of that size (3g.71gb and 4g.71gb share
    71424 MiB on an H200) the one with the fewest SMs that still holds all of the instance's
    compute instances is chosen. Profiles with media extensions (``+me``) look the same as
    their plain twin and are never inferred. A device already named, or one no profile fits,
    is left as it is.
    """
    if model is None:
        return devices
    from gpufleet.catalog import load_catalog

    geo = load_catalog().mig_geometry(model)
    if geo is None:
        return devices
    sms: dict[int | None, int] = {}
    for d in devices:
        sms[d.gpu_instance_id] = sms.get(d.gpu_instance_id, 0) + (d.sm_count or 0)
    out = []
    for d in devices:
        if d.profile_name is not None or d.memory_total_bytes is None:
            out.append(d)
            continue
        mib = d.memory_total_bytes // MIB
        # (SMs, profile) of the non-+me profiles of this size whose SM count the catalog knows
        fits = sorted(
            (p.sm_count, p.name)
            for p in geo.profiles
            if p.memory_mib == mib and p.sm_count is not None and not p.media_extensions
        )
        need = sms.get(d.gpu_instance_id, 0)
        chosen = next((geo.profile(n) for sm, n in fits if sm >= need), None)
        out.append(d if chosen is None else replace(d, profile_name=chosen.name))
    return tuple(out)
