"""A simulated fleet: nodes of simulated GPUs sharing one clock, each node speaking NVML."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gpufleet.catalog import load_catalog
from gpufleet.catalog.cuda import driver_cuda, nvml_cuda_version
from gpufleet.devices.sim.clock import SimClock, real_clock
from gpufleet.devices.sim.faults import Fault
from gpufleet.devices.sim.gpu import DEFAULT_CUDA, DEFAULT_DRIVER, Load, SimGpu
from gpufleet.devices.sim.locks import lock_file, read_locks
from gpufleet.devices.sim.nvml_api import SimNvml
from gpufleet.devices.sim.spec import FleetSpec, NodeSpec
from gpufleet.errors import UnknownNameError

if TYPE_CHECKING:
    from gpufleet.devices.nvml.backend import NvmlBackend


DEMO_LOADS = (
    Load(util=1.0, intensity=1.0, kind="bf16_matmul", fb_used_bytes=60 * 2**30),
    Load(util=0.7, intensity=0.6, mem_util=0.5, kind="inference", fb_used_bytes=40 * 2**30),
    Load(util=0.35, intensity=0.3, mem_util=0.2, kind="dataloader-bound", fb_used_bytes=20 * 2**30),
)


@dataclass
class SimNode:
    """One simulated server: its GPUs and the NVML library it exposes."""

    name: str
    gpus: list[SimGpu]
    clock: SimClock
    rack: str | None = None
    driver_version: str = DEFAULT_DRIVER
    # the CUDA version the driver reports (NVML's encoding, 12040 for 12.4; None: not known)
    cuda_driver_version: int | None = DEFAULT_CUDA
    # whether NVML's set calls succeed (root or a granted capability); False: NoPermission
    power_admin: bool = True
    # where its GPUs' locked clocks are kept for the next process (None: in memory only)
    lock_file: Path | None = None
    nvml: SimNvml = field(init=False)

    def __post_init__(self) -> None:
        self.nvml = SimNvml(self)

    @property
    def nvml_version(self) -> str | None:
        if self.cuda_driver_version is None:
            return None
        return f"{self.cuda_driver_version // 1000}.{self.driver_version}"

    def backend(self) -> NvmlBackend:
        """The production NVML backend over this node's simulated library."""
        from gpufleet.devices.nvml.backend import NvmlBackend

        return NvmlBackend(lib=self.nvml, node_name=self.name, clock=self.clock)


def cuda_of(driver: str) -> int | None:
    """The CUDA version (NVML's encoding) a simulated node with ``driver`` reports: the
    driver's own, from the catalog's table (`gpufleet.catalog.cuda.driver_cuda`)."""
    release = driver_cuda(driver)
    return None if release is None else nvml_cuda_version(release)


class SimFleet:
    """Every simulated node of a spec, with deterministic identities (seeded)."""

    def __init__(self, spec: FleetSpec, clock: SimClock | None = None) -> None:
        self.spec = spec
        self.clock: SimClock = clock or real_clock
        t0 = self.clock()
        catalog = load_catalog()
        self.nodes: dict[str, SimNode] = {}
        for ns in spec.nodes:
            self.nodes[ns.name] = self._make_node(ns, catalog.gpus[ns.model], t0)
        for fault in spec.faults:
            self.inject(fault)

    def _make_node(self, ns: NodeSpec, model: object, t0: float) -> SimNode:
        from gpufleet.catalog import GpuModel

        assert isinstance(model, GpuModel)
        driver = ns.driver_version or DEFAULT_DRIVER
        gpus = [
            SimGpu(
                model=model,
                index=i,
                node=ns.name,
                seed=self.spec.seed,
                t0=t0,
                driver_version=driver,
                vbios_version=ns.vbios_version,
                mig_enabled=ns.mig_enabled,
                mig_layout=ns.mig_layout,
            )
            for i in range(ns.gpus)
        ]
        node = SimNode(
            name=ns.name,
            gpus=gpus,
            clock=self.clock,
            rack=ns.rack,
            driver_version=driver,
            cuda_driver_version=cuda_of(driver),
            power_admin=ns.power_admin,
        )
        if self.spec.source is not None:  # locks another process left stay (a real GPU's do)
            node.lock_file = lock_file(self.spec.source, ns.name)
            for index, mhz in read_locks(node.lock_file).items():
                if 0 <= index < len(gpus):
                    gpus[index].locked_clocks_mhz = mhz
        return node

    def node(self, name: str) -> SimNode:
        if name not in self.nodes:
            raise UnknownNameError("node", name, sorted(self.nodes))
        return self.nodes[name]

    def reload_node(self, name: str, spec: FleetSpec) -> None:
        """Take one node's versions and its new faults from ``spec`` (the fleet file read
        again after a simulated update, `gpufleet.devices.sim.update`, recorded the node's new
        state beside it: `gpufleet.devices.sim.state`): what an agent restarted after the
        update would see."""
        node = self.node(name)
        ns = next((n for n in spec.nodes if n.name == name), None)
        if ns is None:
            return
        driver = ns.driver_version or DEFAULT_DRIVER
        node.driver_version = driver
        node.cuda_driver_version = cuda_of(driver)
        for gpu in node.gpus:
            with gpu.lock:
                gpu.driver_version = driver
                if ns.vbios_version is not None:
                    gpu.vbios_version = ns.vbios_version
        for fault in spec.faults:
            if fault.node == name and fault not in self.spec.faults:
                self.inject(fault)
        self.spec = FleetSpec(
            nodes=self.spec.nodes,
            seed=self.spec.seed,
            faults=(*self.spec.faults, *(f for f in spec.faults if f.node == name)),
            source=self.spec.source,
        )

    def inject(self, fault: Fault) -> None:
        """Add a fault to one GPU, every GPU of a node, or (no node) every GPU of the fleet."""
        nodes = [self.node(fault.node)] if fault.node else list(self.nodes.values())
        for node in nodes:
            for gpu in node.gpus:
                if fault.gpu is None or fault.gpu == gpu.index:
                    gpu.add_fault(fault)

    def run_everywhere(self, load: Load, duration_s: float | None = None) -> None:
        for node in self.nodes.values():
            for gpu in node.gpus:
                gpu.run(load, start_s=self.clock(), duration_s=duration_s)

    def backends(self) -> list[NvmlBackend]:
        return [n.backend() for n in self.nodes.values()]

    def demo_activity(self, busy_fraction: float = 0.7) -> None:
        """A seeded mix of loads: most nodes busy with one of a few job shapes, some idle."""
        import random

        rng = random.Random(self.spec.seed)
        now = self.clock()
        for node in self.nodes.values():
            shape = rng.choice(DEMO_LOADS)
            if rng.random() < busy_fraction:
                for gpu in node.gpus:
                    with gpu.lock:
                        gpu.t = min(gpu.t, now - 60.0)  # integrate a minute of history
                    gpu.run(shape, start_s=now - 60.0)
