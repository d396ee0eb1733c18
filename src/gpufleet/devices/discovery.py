"""Find the GPUs a command should look at: the simulated fleet (``--sim``), imported
nvidia-smi reports (``--import``), or this machine's real GPUs through NVML."""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpufleet.devices.backend import GpuBackend
from gpufleet.devices.deadline import (
    NVML_TIMEOUT_S,
    DeadlineBackend,
    NvmlTimeoutError,
    with_deadlines,
)
from gpufleet.devices.host import read_host
from gpufleet.devices.types import DeviceInfo, NodeInventory, Sample
from gpufleet.errors import DeviceError, GpuLostError, NoDeviceError, UsageError

NO_GPU_HINT = "try a simulated fleet: --sim 1x8xh100 (or --import nvidia-smi-q.xml)"


@dataclass
class Fleet:
    """The nodes a command works on, with their backends (none for imported reports)."""

    kind: str  # "nvml", "sim", "import"
    backends: list[GpuBackend] = field(default_factory=list)
    imported: list[tuple[NodeInventory, list[Sample]]] = field(default_factory=list)
    sim: Any = None  # the SimFleet when kind == "sim"
    import_result: Any = None  # the ImportResult when kind == "import"

    def close(self) -> None:
        for b in self.backends:
            b.close()

    def bounded(self, timeout_s: float = NVML_TIMEOUT_S) -> Fleet:
        """This fleet with a deadline on every NVML call (`gpufleet.devices.deadline`)."""
        self.backends = [with_deadlines(b, timeout_s) for b in self.backends]
        return self


def read_each(backend: GpuBackend, method: str, indexes: Iterable[int]) -> dict[int, Any]:
    """``backend.<method>(i)`` for each GPU: the result or the `DeviceError` it raised. GPUs are
    read together within one deadline when the backend has deadlines, else one after another."""
    out: dict[int, Any]
    if isinstance(backend, DeadlineBackend):
        out = backend.each(method, indexes)
    else:
        out = {}
        for i in indexes:
            try:
                out[i] = getattr(backend, method)(i)
            except DeviceError as exc:
                out[i] = exc
    for value in out.values():
        if isinstance(value, BaseException) and not isinstance(value, DeviceError):
            raise value
    return out


def open_sim(spec: str, seed: int = 7) -> Fleet:
    from gpufleet.devices.sim import SimFleet, parse_fleet_spec

    sim = SimFleet(parse_fleet_spec(spec, seed=seed))
    return Fleet(kind="sim", backends=list(sim.backends()), sim=sim)


def open_local_nvml() -> Fleet:
    """This machine's GPUs. Raises NoDeviceError (exit 2) with a hint when there are none."""
    from gpufleet.devices.nvml.backend import NvmlBackend, load_pynvml

    backend = NvmlBackend(lib=load_pynvml(), node_name=socket.gethostname())
    try:
        count = backend.device_count()
    except NoDeviceError as exc:
        raise NoDeviceError(
            "no NVIDIA GPU found: NVML is not available here", hint=NO_GPU_HINT
        ) from exc
    if count == 0:
        backend.close()
        raise NoDeviceError("no NVIDIA GPU found: NVML reports 0 devices", hint=NO_GPU_HINT)
    return Fleet(kind="nvml", backends=[backend])


def open_imports(paths: list[Path]) -> Fleet:
    """Imported nvidia-smi reports (``gpufleet.devices.smi.importer``): what parses becomes a
    node; unreadable files and GPUs and warnings ride along on ``Fleet.import_result``."""
    from gpufleet.devices.smi.importer import import_reports

    for path in paths:
        if path.is_dir():
            raise UsageError(f"{path}: is a directory; expected an nvidia-smi -q -x report")
    result = import_reports(paths)
    if not result.nodes:
        if len(paths) == 1 and not paths[0].exists():
            raise NoDeviceError(f"{paths[0]}: no such file")
        raise NoDeviceError("no report could be imported: " + "; ".join(result.failed))
    fleet = Fleet(kind="import", import_result=result)
    for node in result.nodes:
        fleet.imported.append(
            (node.report.node_inventory(node.name), [g.sample for g in node.report.gpus])
        )
    return fleet


def open_fleet(sim: str | None = None, imports: list[Path] | None = None, seed: int = 7) -> Fleet:
    """``--sim``, else ``--import``, else real NVML; both at once is a usage error."""
    if sim and imports:
        raise UsageError("--sim and --import are mutually exclusive: give one or the other")
    if sim:
        return open_sim(sim, seed=seed)
    if imports:
        return open_imports(imports)
    return open_local_nvml()


def node_inventory(backend: GpuBackend) -> tuple[NodeInventory, list[str]]:
    """Every GPU's DeviceInfo of one node; lost GPUs are reported, not fatal."""
    gpus: list[DeviceInfo] = []
    notes: list[str] = []
    for i, value in read_each(backend, "device_info", range(backend.device_count())).items():
        if isinstance(value, GpuLostError | NvmlTimeoutError):
            notes.append(str(value))
        elif isinstance(value, DeviceError):
            notes.append(f"GPU {i}: {value}")
        else:
            gpus.append(value)
    driver = next((g.driver_version for g in gpus if g.driver_version), None)
    cuda = next((g.cuda_driver_version for g in gpus if g.cuda_driver_version), None)
    source = "sim" if type(getattr(backend, "_lib", None)).__name__ == "SimNvml" else "nvml"
    return (
        NodeInventory(
            backend.node_name,
            tuple(gpus),
            source=source,
            driver_version=driver,
            cuda_driver_version=cuda,
            host=read_host() if source == "nvml" else None,  # a simulated node has no host
        ),
        notes,
    )


def collect(fleet: Fleet) -> tuple[list[NodeInventory], list[str]]:
    """Inventories of every node of a fleet, with notes on GPUs that could not be read."""
    nodes: list[NodeInventory] = []
    notes: list[str] = []
    for backend in fleet.backends:
        inv, n = node_inventory(backend)
        nodes.append(inv)
        notes.extend(n)
    nodes.extend(inv for inv, _ in fleet.imported)
    return nodes, notes
