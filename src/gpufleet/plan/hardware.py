"""Candidate hardware: a catalog GPU or system resolved to the server the plan is built from.

Power always comes from the catalog system (e.g. DGX H100 10.2 kW, DGX B200 14.3 kW), never from
GPU TDP alone. A GPU with no catalog system gets a generic 8-GPU server: 8 x GPU TDP + a stated
host overhead (CPUs, memory, NICs, fans), named in the plan's assumptions. PCIe GPUs can also be
planned as a pilot: a 2U server (or a deskside workstation: same power) of 1, 2 or 4 GPUs with a
smaller stated host overhead (default 1 kW: two CPUs, memory, NICs and fans of a 2U host).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

from gpufleet.catalog import Catalog, GpuModel
from gpufleet.errors import UnknownNameError

__all__ = ["PILOT_FORM_FACTORS", "Server", "resolve_candidate"]

GENERIC_GPUS_PER_SERVER = 8
PILOT_MAX_GPUS = 4
PILOT_FORM_FACTORS = ("pcie", "nvl")


@dataclass(frozen=True)
class Server:
    """The server a candidate is planned on, with the figures the planner needs."""

    candidate: str
    key: str
    name: str
    gpu_key: str
    gpu_name: str
    gpus: int
    power_kw: float
    rack_units: int
    compute_nics: int
    compute_nic_gbps: int
    storage_nics: int
    local_nvme_bytes: int | None
    gpu_memory_bytes: int
    gpu_bandwidth_gbps: float
    gpu_tdp_w: float
    generic: bool
    source: str


class _GpuFigures(TypedDict):
    """The fields of a `Server` that come from its GPU's catalog model."""

    gpu_key: str
    gpu_name: str
    gpu_memory_bytes: int
    gpu_bandwidth_gbps: float
    gpu_tdp_w: float


def _gpu_figures(gpu: GpuModel) -> _GpuFigures:
    """``gpu``'s figures as `Server` fields."""
    return _GpuFigures(
        gpu_key=gpu.key,
        gpu_name=gpu.marketing_name,
        gpu_memory_bytes=gpu.memory_bytes,
        gpu_bandwidth_gbps=gpu.memory_bandwidth_gbps,
        gpu_tdp_w=gpu.max_power_w,
    )


def _generic(
    candidate: str, gpu: GpuModel, host_overhead_w: float, n: int = GENERIC_GPUS_PER_SERVER
) -> Server:
    big = gpu.form_factor in ("sxm", "oam", "superchip")
    pilot = n <= PILOT_MAX_GPUS and not big
    if pilot:  # a 2U PCIe server (a deskside workstation draws the same)
        key, name = f"pilot-{gpu.key}-x{n}", f"{n}-GPU PCIe server ({gpu.marketing_name})"
        rack_units, compute_nics, storage_nics = 2, max(1, n // 2), 1
        layout = (
            "2U PCIe server (a deskside workstation draws the same), 1 NIC per 2 GPUs at 400 Gb/s"
        )
    else:
        key, name = f"generic-{gpu.key}-x{n}", f"Generic {n}x {gpu.marketing_name}"
        rack_units, compute_nics, storage_nics = (8, n, 2) if big else (4, n // 2, 2)
        layout = f"{'8U, 1 NIC per GPU' if big else '4U, 1 NIC per 2 GPUs'}, 400 Gb/s NICs"
    return Server(
        candidate=candidate,
        key=key,
        name=name,
        gpus=n,
        power_kw=(n * gpu.max_power_w + host_overhead_w) / 1000.0,
        rack_units=rack_units,
        compute_nics=compute_nics,
        compute_nic_gbps=400,
        storage_nics=storage_nics,
        local_nvme_bytes=None,
        generic=True,
        source=(
            f"gpufleet assumption: {'pilot ' if pilot else ''}"
            f"{n} x {gpu.max_power_w:.0f} W TDP ({gpu.source}) + "
            f"{host_overhead_w / 1000:.1f} kW host overhead; {layout}"
        ),
        **_gpu_figures(gpu),
    )


def resolve_candidate(
    catalog: Catalog,
    name: str,
    host_overhead_w: float,
    field: str = "candidates",
    gpus_per_server: int | None = None,
    pilot_overhead_w: float = 1000.0,
) -> Server:
    """A catalog system key/name, or a GPU key/alias (its first catalog system, else generic).

    Unknown names raise :class:`UnknownNameError` with did-you-mean over GPUs and systems; the
    message starts with the spec field path.
    """
    system = None
    try:
        system = catalog.system(name)
    except UnknownNameError:
        gpu = catalog.find_gpu(name)
        if gpu is None:
            known = sorted({*catalog.gpus, *catalog.systems})
            err = UnknownNameError("GPU model or system", name, known)
            err.message = f"{field}: {err.message}"
            err.args = (err.message,)
            raise err from None
        systems = catalog.systems_for(gpu.key)
        if gpus_per_server is not None and gpu.form_factor in PILOT_FORM_FACTORS:
            small = gpus_per_server <= PILOT_MAX_GPUS
            return _generic(
                name, gpu, pilot_overhead_w if small else host_overhead_w, gpus_per_server
            )
        if not systems:
            return _generic(name, gpu, host_overhead_w)
        system = systems[0]
    return Server(
        candidate=name,
        key=system.key,
        name=system.name,
        gpus=system.gpus,
        power_kw=system.max_power_kw,
        rack_units=system.rack_units,
        compute_nics=system.compute_nics,
        compute_nic_gbps=system.compute_nic_gbps,
        storage_nics=system.storage_nics,
        local_nvme_bytes=system.local_nvme_bytes,
        generic=False,
        source=system.source,
        **_gpu_figures(catalog.gpus[system.gpu]),
    )
