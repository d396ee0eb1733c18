"""Every fault kind shows with no parameters (issue 31): a fleet file whose fault line names only
``kind`` on GPU 3 of node ``n`` makes `gpufleet health --sim` (the same collection and rules, in
this process) or `gpufleet validate --sim` at the level that can see it report a finding on that
GPU (or its node's link). Parametrized over the registry: a new kind whose default shows
nothing fails here."""

from __future__ import annotations

import pytest

from gpufleet.devices.deadline import with_deadlines
from gpufleet.devices.sim import FaultKind, ManualClock, SimFleet
from gpufleet.devices.sim.faults import UPDATE_FAULTS
from gpufleet.devices.sim.spec import parse_fleet_yaml
from gpufleet.health import HealthTracker, collect_node
from gpufleet.health.types import Severity
from gpufleet.simvalidate import SimEngine
from gpufleet.validate.results import Status
from gpufleet.validate.runner import RunOptions, run_suite
from gpufleet.validate.suite import select_tests

GPU = 3
# What only a device test sees (decided here, not read from the code): the level that runs it.
VALIDATE_ONLY = {FaultKind.SLOW_GPU: 2, FaultKind.MEMORY_ERRORS: 2, FaultKind.SLOW_LINK: 3}


def _fleet(kind: FaultKind, nodes: int) -> tuple[SimFleet, ManualClock]:
    names = ["n"] + [f"m{i}" for i in range(nodes - 1)]
    text = "nodes:\n" + "".join(f"  - {{name: {x}, model: h200, gpus: 8}}\n" for x in names)
    text += f"faults:\n  - {{node: n, gpu: {GPU}, kind: {kind.value}}}\n"
    clock = ManualClock()
    return SimFleet(parse_fleet_yaml(text, "fleet.yaml"), clock=clock), clock


def _release(fleet: SimFleet) -> None:
    for node in fleet.nodes.values():
        for g in node.gpus:
            g.hang_release.set()


@pytest.mark.parametrize("kind", list(FaultKind), ids=lambda k: k.value)
def test_a_bare_fault_line_is_reported_on_its_gpu(kind: FaultKind) -> None:
    if kind in UPDATE_FAULTS:
        from gpufleet.devices.sim.update import apply_update

        doc = {
            "nodes": [{"name": "n", "model": "h200", "gpus": 8, "driver_version": "535.104.05"}],
            "faults": [{"kind": kind.value, "node": "n", "gpu": GPU}],
        }
        new, hang = apply_update(doc, "n", "550.90.07", None)
        clean, _ = apply_update({"nodes": doc["nodes"]}, "n", "550.90.07", None)
        assert hang or new != clean  # the update goes wrong in a way a campaign can see
        return
    level = VALIDATE_ONLY.get(kind)
    fleet, clock = _fleet(kind, 4 if kind is FaultKind.SLOW_LINK else 1)
    try:
        if level is None:  # `gpufleet health --sim fleet.yaml` (3 s window)
            backend = with_deadlines(fleet.node("n").backend(), 0.5)
            data = collect_node(backend, duration_s=3.0, sleep=clock.advance, clock=clock)
            report = HealthTracker(None, clock=clock).evaluate(data)
            mine = [f for f in report.findings if f.severity >= Severity.WARN]
            assert mine and {f.gpu_index for f in mine} == {GPU}, [
                (f.code, f.gpu_index) for f in report.findings
            ]
            return
        engine = SimEngine(fleet, clock)
        tests = select_tests(level, multi_node=len(fleet.nodes) > 1)
        opts = RunOptions(tests=tests, level=level, stress_s=30.0, power_s=10.0)
        vrep = run_suite(engine, opts)
        bad = {r.component for r in vrep.results if r.status in (Status.WARN, Status.FAIL)}
        if kind is FaultKind.SLOW_LINK:  # node n's network link (the fleet collective waits)
            assert "n" in bad and bad <= {"n", "fleet"}, bad
        else:
            assert bad == {f"n/gpu{GPU}"}, bad
    finally:
        _release(fleet)
