"""Parser of ``nvidia-smi --query-gpu=FIELDS --format=csv[,noheader][,nounits]``.

The header names each column by its canonical field name plus a unit (``memory.total [MiB]``);
query aliases (``gpu_name``, ``clocks.sm``, ``clocks_throttle_reasons.active``...) are mapped to
the canonical names, as listed by ``nvidia-smi --help-query-gpu`` (driver 580,
tests/fixtures/nvidia-h200/nvidia-smi-help-query-gpu.txt). Without a header, pass the field list
you queried. Cells may carry units (``79.46 W``) or not (``nounits``).
"""

from __future__ import annotations

import csv
import io
from calendar import timegm
from collections.abc import Sequence
from datetime import datetime

from gpufleet.devices.smi.values import (
    MIB,
    Where,
    clean,
    hex_mask,
    integer,
    link_width,
    number,
    pci_device_id,
    switch,
)
from gpufleet.devices.types import DeviceInfo, Sample
from gpufleet.errors import ParseError

# alias -> canonical name ("A" or "B" pairs of nvidia-smi --help-query-gpu, driver 580).
ALIASES: dict[str, str] = {
    "gpu_name": "name",
    "gpu_serial": "serial",
    "gpu_uuid": "uuid",
    "gpu_bus_id": "pci.bus_id",
    "inforom.image": "inforom.img",
    "inforom.power": "inforom.pwr",
    "clocks.gr": "clocks.current.graphics",
    "clocks.sm": "clocks.current.sm",
    "clocks.mem": "clocks.current.memory",
    "clocks.video": "clocks.current.video",
    "clocks.max.gr": "clocks.max.graphics",
    "clocks.max.mem": "clocks.max.memory",
    "retired_pages.sbe": "retired_pages.single_bit_ecc.count",
    "retired_pages.dbe": "retired_pages.double_bit.count",
    "remapped_rows.sbe": "remapped_rows.correctable",
    "remapped_rows.dbe": "remapped_rows.uncorrectable",
    "gpu.power.draw.average": "power.draw.average",
    "gpu.power.draw.instant": "power.draw.instant",
    "gpu.power.requested_limit": "power.limit",
    "gpu.power.current_limit": "enforced.power.limit",
    "gpu.power.default_limit": "power.default_limit",
    "gpu.power.min_limit": "power.min_limit",
    "gpu.power.max_limit": "power.max_limit",
}
_THROTTLE = "clocks_throttle_reasons."
_EVENT = "clocks_event_reasons."

# The query-gpu fields that make one full gpufleet Sample (plus the identity needed to attach it
# to a GPU). A benchmark times `nvidia-smi --query-gpu=<these>` against one NVML sweep.
QUERY_FIELDS: tuple[str, ...] = (
    "timestamp",
    "index",
    "uuid",
    "name",
    "utilization.gpu",
    "utilization.memory",
    "utilization.encoder",
    "utilization.decoder",
    "memory.used",
    "memory.free",
    "memory.reserved",
    "temperature.gpu",
    "temperature.memory",
    "power.draw",
    "clocks.current.sm",
    "clocks.current.memory",
    "clocks_event_reasons.active",
    "ecc.errors.corrected.volatile.total",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.corrected.aggregate.total",
    "ecc.errors.uncorrected.aggregate.total",
    "remapped_rows.correctable",
    "remapped_rows.uncorrectable",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "retired_pages.single_bit_ecc.count",
    "retired_pages.double_bit.count",
    "retired_pages.pending",
)


def canonical(field: str) -> str:
    """The canonical name of a query field or header cell (unit and alias removed)."""
    name = field.strip()
    if name.endswith("]") and " [" in name:
        name = name[: name.rindex(" [")]
    name = ALIASES.get(name, name)
    if name.startswith(_THROTTLE):
        name = _EVENT + name.removeprefix(_THROTTLE)
    return name


class _Row:
    """One CSV row keyed by canonical field name, with line/column for error messages."""

    def __init__(self, cells: dict[str, str], columns: dict[str, int], line: int, source: str):
        self.cells = cells
        self.columns = columns
        self.line = line
        self.source = source

    def where(self, field: str) -> Where:
        return Where(self.source, f"line {self.line}, column {self.columns[field] + 1} ({field})")

    def text(self, field: str) -> str | None:
        return clean(self.cells.get(field))

    def float_(self, field: str, *units: str) -> float | None:
        if field not in self.cells:
            return None
        return number(self.cells[field], self.where(field), units)

    def int_(self, field: str, *units: str) -> int | None:
        if field not in self.cells:
            return None
        return integer(self.cells[field], self.where(field), units)

    def bool_(self, field: str) -> bool | None:
        if field not in self.cells:
            return None
        return switch(self.cells[field], self.where(field))

    def mib(self, field: str) -> int | None:
        value = self.int_(field, "MiB")
        return None if value is None else value * MIB

    def width(self, field: str) -> int | None:
        if field not in self.cells:
            return None
        return link_width(self.cells[field], self.where(field))

    def mask(self, field: str) -> int | None:
        if field not in self.cells:
            return None
        return hex_mask(self.cells[field], self.where(field))


def parse_query_gpu_csv(
    text: str, source: str = "<string>", fields: Sequence[str] | None = None
) -> list[tuple[DeviceInfo, Sample]]:
    """Parse ``--query-gpu`` CSV output into one (DeviceInfo, Sample) per GPU row.

    ``fields``: the queried field names, needed for ``noheader`` output; when given and the first
    line is nevertheless a header naming the same fields, that line is skipped.
    """
    rows = [
        r for r in csv.reader(io.StringIO(text), skipinitialspace=True) if any(c.strip() for c in r)
    ]
    if not rows:
        raise ParseError(source, "line 1", "empty; expected nvidia-smi --query-gpu CSV output")
    first_line = 1
    if fields is None:
        names = [canonical(c) for c in rows[0]]
        data = rows[1:]
        first_line = 2
    else:
        names = [canonical(f) for f in fields]
        if [canonical(c) for c in rows[0]] == names:
            data = rows[1:]
            first_line = 2
        else:
            data = rows
    columns = {name: i for i, name in enumerate(names)}
    for need in ("uuid", "name"):
        if need not in columns:
            raise ParseError(source, "header", f"the {need!r} field is needed to identify each GPU")
    out: list[tuple[DeviceInfo, Sample]] = []
    for n, cells in enumerate(data):
        line = first_line + n
        if len(cells) != len(names):
            raise ParseError(
                source, f"line {line}", f"{len(cells)} columns, the header names {len(names)}"
            )
        row = _Row({name: cells[i] for name, i in columns.items()}, columns, line, source)
        out.append((_device_info(row, n), _sample(row)))
    return out


def _csv_time(row: _Row) -> float:
    stamp = row.text("timestamp")
    if stamp is None:
        return 0.0
    for fmt in ("%Y/%m/%d %H:%M:%S.%f", "%Y/%m/%d %H:%M:%S"):
        try:
            parsed = datetime.strptime(stamp, fmt)
        except ValueError:
            continue
        return timegm(parsed.timetuple()) + parsed.microsecond / 1e6
    raise row.where("timestamp").error(f"{stamp!r} is not a time like '2026/11/30 14:56:07.028'")


def _device_info(row: _Row, position: int) -> DeviceInfo:
    uuid = row.text("uuid")
    name = row.text("name")
    if uuid is None:
        raise row.where("uuid").error("missing: every GPU must have a uuid")
    if name is None:
        raise row.where("name").error("missing: every GPU must have a name")
    index = row.int_("index")
    pci_id = pci_device_id(row.text("pci.device_id"))
    from gpufleet.catalog import load_catalog

    model = load_catalog().gpu_by_nvml_name(name, pci_id)
    return DeviceInfo(
        index=index if index is not None else position,
        uuid=uuid,
        name=name,
        model=model.key if model is not None else None,
        pci_bus_id=row.text("pci.bus_id"),
        pci_device_id=pci_id,
        serial=row.text("serial"),
        vbios_version=row.text("vbios_version"),
        inforom_version=row.text("inforom.img") or row.text("inforom.oem"),
        driver_version=row.text("driver_version"),
        memory_total_bytes=row.mib("memory.total"),
        power_limit_default_w=row.float_("power.default_limit", "W"),
        power_limit_min_w=row.float_("power.min_limit", "W"),
        power_limit_max_w=row.float_("power.max_limit", "W"),
        power_limit_enforced_w=row.float_("enforced.power.limit", "W"),
        max_sm_clock_mhz=row.int_("clocks.max.sm", "MHz"),
        max_mem_clock_mhz=row.int_("clocks.max.memory", "MHz"),
        pcie_gen_current=row.int_("pcie.link.gen.current"),
        pcie_gen_max=row.int_("pcie.link.gen.max"),
        pcie_width_current=row.width("pcie.link.width.current"),
        pcie_width_max=row.width("pcie.link.width.max"),
        persistence_mode=row.bool_("persistence_mode"),
        ecc_current=row.bool_("ecc.mode.current"),
        ecc_pending=row.bool_("ecc.mode.pending"),
        mig_current=row.bool_("mig.mode.current"),
        mig_pending=row.bool_("mig.mode.pending"),
        compute_mode=row.text("compute_mode"),
    )


def _sample(row: _Row) -> Sample:
    return Sample(
        timestamp_s=_csv_time(row),
        gpu_util_pct=row.float_("utilization.gpu", "%"),
        mem_util_pct=row.float_("utilization.memory", "%"),
        enc_util_pct=row.float_("utilization.encoder", "%"),
        dec_util_pct=row.float_("utilization.decoder", "%"),
        mem_used_bytes=row.mib("memory.used"),
        mem_free_bytes=row.mib("memory.free"),
        mem_reserved_bytes=row.mib("memory.reserved"),
        gpu_temp_c=row.float_("temperature.gpu", "C"),
        mem_temp_c=row.float_("temperature.memory", "C"),
        power_w=_first(row, ("power.draw", "power.draw.average", "power.draw.instant")),
        sm_clock_mhz=row.int_("clocks.current.sm", "MHz"),
        mem_clock_mhz=row.int_("clocks.current.memory", "MHz"),
        clock_event_reasons=row.mask("clocks_event_reasons.active"),
        ecc_sbe_volatile=row.int_("ecc.errors.corrected.volatile.total"),
        ecc_dbe_volatile=row.int_("ecc.errors.uncorrected.volatile.total"),
        ecc_sbe_aggregate=row.int_("ecc.errors.corrected.aggregate.total"),
        ecc_dbe_aggregate=row.int_("ecc.errors.uncorrected.aggregate.total"),
        remapped_rows_correctable=row.int_("remapped_rows.correctable"),
        remapped_rows_uncorrectable=row.int_("remapped_rows.uncorrectable"),
        remap_pending=row.bool_("remapped_rows.pending"),
        remap_failure=row.bool_("remapped_rows.failure"),
        retired_pages_sbe=row.int_("retired_pages.single_bit_ecc.count"),
        retired_pages_dbe=row.int_("retired_pages.double_bit.count"),
        retired_pages_pending=row.bool_("retired_pages.pending"),
    )


def _first(row: _Row, fields: tuple[str, ...]) -> float | None:
    for field in fields:
        value = row.float_(field, "W")
        if value is not None:
            return value
    return None
