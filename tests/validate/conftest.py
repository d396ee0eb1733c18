"""Fixtures: simulated fleets on a manual clock, with and without injected faults."""

from __future__ import annotations

from gpufleet.devices.sim import Fault, FaultKind, ManualClock, SimFleet, parse_fleet_spec
from gpufleet.simvalidate import SimEngine
from gpufleet.validate.results import ValidationReport
from gpufleet.validate.runner import RunOptions, run_suite
from gpufleet.validate.suite import select_tests

FAULTS = (
    Fault(FaultKind.SLOW_GPU, node="sim-01", gpu=2, params={"fraction": 0.85}),
    Fault(FaultKind.PCIE_DOWNGRADE, node="sim-02", gpu=3, params={"gen": 4}),
    Fault(FaultKind.MEMORY_ERRORS, node="sim-03", gpu=4, params={"count": 3}),
    Fault(FaultKind.HW_POWER_BRAKE, node="sim-04", gpu=5),
    Fault(FaultKind.SLOW_LINK, node="sim-05", params={"fraction": 0.5}),
    Fault(FaultKind.ROW_REMAP_PENDING, node="sim-06", gpu=6),
    Fault(FaultKind.SLOW_LINK, node="sim-07", params={"fraction": 0.6, "peer": "sim-08"}),
)


def run_sim(
    spec: str = "16x8xh200",
    seed: int = 7,
    level: int = 3,
    faults: tuple[Fault, ...] = (),
    stress_s: float = 20.0,
    **kw: object,
) -> ValidationReport:
    clock = ManualClock()
    fleet = SimFleet(parse_fleet_spec(spec, seed=seed), clock=clock)
    for f in faults:
        fleet.inject(f)
    engine = SimEngine(fleet, clock)
    tests = select_tests(level, multi_node=len(fleet.nodes) > 1)
    opts = RunOptions(tests=tests, level=level, stress_s=stress_s, power_s=10.0, **kw)  # type: ignore[arg-type]
    return run_sim_engine(engine, opts)


def run_sim_engine(engine: SimEngine, opts: RunOptions) -> ValidationReport:
    return run_suite(engine, opts)
