"""Candidate hardware: a catalog GPU or system resolved to the server the plan is built from.

Power always comes from the catalog system (e.g. DGX H100 10.2 kW, DGX B200 14.3 kW), never from
GPU TDP alone. A GPU with no catalog system gets a generic 8-GPU server: 8 x GPU TDP + a stated
host overhead (CPUs, memory, NICs, fans), named in the plan's assumptions.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet.catalog import Catalog, GpuModel
from gpufleet.errors import UnknownNameError

__all__ = ["Server", "resolve_candidate"]

GENERIC_GPUS_PER_SERVER = 8


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


def _generic(candidate: str, gpu: GpuModel, host_overhead_w: float) -> Server:
    n = GENERIC_GPUS_PER_SERVER
    big = gpu.form_factor in ("sxm", "oam", "superchip")
    return Server(
        candidate=candidate,
        key=f"generic-{gpu.key}-x{n}",
        name=f"Generic {n}x {gpu.marketing_name}",
        gpu_key=gpu.key,
        gpu_name=gpu.marketing_name,
        gpus=n,
        power_kw=(n * gpu.max_power_w + host_overhead_w) / 1000.0,
        rack_units=8 if big else 4,
        compute_nics=n if big else n // 2,
        compute_nic_gbps=400,
        storage_nics=2,
        local_nvme_bytes=None,
        gpu_memory_bytes=gpu.memory_bytes,
        gpu_bandwidth_gbps=gpu.memory_bandwidth_gbps,
        gpu_tdp_w=gpu.max_power_w,
        generic=True,
        source=(
            f"gpufleet assumption: {n} x {gpu.max_power_w:.0f} W TDP ({gpu.source}) + "
            f"{host_overhead_w / 1000:.1f} kW host overhead; "
            f"{'8U, 1 NIC per GPU' if big else '4U, 1 NIC per 2 GPUs'}, 400 Gb/s NICs"
        ),
    )


def resolve_candidate(
    catalog: Catalog, name: str, host_overhead_w: float, field: str = "candidates"
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
        if not systems:
            return _generic(name, gpu, host_overhead_w)
        system = systems[0]
    gpu = catalog.gpus[system.gpu]
    return Server(
        candidate=name,
        key=system.key,
        name=system.name,
        gpu_key=gpu.key,
        gpu_name=gpu.marketing_name,
        gpus=system.gpus,
        power_kw=system.max_power_kw,
        rack_units=system.rack_units,
        compute_nics=system.compute_nics,
        compute_nic_gbps=system.compute_nic_gbps,
        storage_nics=system.storage_nics,
        local_nvme_bytes=system.local_nvme_bytes,
        gpu_memory_bytes=gpu.memory_bytes,
        gpu_bandwidth_gbps=gpu.memory_bandwidth_gbps,
        gpu_tdp_w=gpu.max_power_w,
        generic=False,
        source=system.source,
    )
