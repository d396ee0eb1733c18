"""An NVML simulator: the same calls, return types and errors as pynvml, over a physics model
calibrated on a real H200, with deterministic fault injection."""

from gpufleet.devices.sim.clock import ManualClock, SimClock
from gpufleet.devices.sim.faults import Fault, FaultKind
from gpufleet.devices.sim.fleet import SimFleet, SimNode
from gpufleet.devices.sim.gpu import Load, SimGpu
from gpufleet.devices.sim.nvml_api import SimNvml
from gpufleet.devices.sim.spec import FleetSpec, NodeSpec, parse_fleet_spec

__all__ = [
    "Fault",
    "FaultKind",
    "FleetSpec",
    "Load",
    "ManualClock",
    "NodeSpec",
    "SimClock",
    "SimFleet",
    "SimGpu",
    "SimNode",
    "SimNvml",
    "parse_fleet_spec",
]
