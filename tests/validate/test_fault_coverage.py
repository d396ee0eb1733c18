"""The fault-coverage table (issue 14 item 2), decided in advance: for every fault kind the
simulator can inject, the detector named in the issue catches it and names the right GPU, node
or link. The table is `COVERAGE`; `docs/validate.md` shows it to people. A fault kind added to
the simulator without a row here fails `test_every_fault_kind_has_a_row` and its own case.

Each case injects one fault on one simulated node (GPU 2, or the link sim-01<->sim-02), then
runs `gpufleet health`'s collection and rules (``collect_node`` + ``HealthTracker``, as the CLI
does) and `validate` at the level the row needs (``run_suite`` with the simulator engine), and
checks each expected verdict on the faulty component: at least as bad as the table says (a fail
where a warn is asked is "more", which the issue allows), and only on that component.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpufleet.devices.deadline import with_deadlines
from gpufleet.devices.sim import Fault, FaultKind, ManualClock, SimFleet, parse_fleet_spec
from gpufleet.health import HealthTracker, collect_node
from gpufleet.health.types import Severity
from gpufleet.simvalidate import SimEngine
from gpufleet.validate.results import Status, TestResult, ValidationReport
from gpufleet.validate.runner import RunOptions, run_suite
from gpufleet.validate.suite import select_tests

GPU = 2  # the faulty GPU of every GPU fault
NODE = "sim-00"
RANK = {Status.PASS: 0, Status.SKIP: 0, Status.WARN: 1, Status.FAIL: 2}


@dataclass(frozen=True)
class Row:
    """What must catch one fault kind."""

    params: dict[str, Any] = field(default_factory=dict)
    health: Severity | None = None  # the faulty GPU's health verdict, at least
    health_codes: frozenset[str] = frozenset()  # finding codes of which one must be present
    # (level, test, status at least) on the faulty component
    validate: tuple[tuple[int, str, Status], ...] = ()
    more: Callable[[ValidationReport, list[Any]], None] | None = None  # extra checks
    # update faults (issue 15): the maintenance campaign's step that catches them ("verify":
    # versions against the baseline, "validate": the agent's level 1 after the update,
    # "back": the node does not come back; a lost GPU is caught at verify by its finding, or
    # at validate); checked by `test_update_fault_is_caught`
    campaign: str | None = None
    spec: str = "1x8xh200"
    node: str = NODE


def _stress_names(reason: str) -> Callable[[ValidationReport, list[Any]], None]:
    def check(report: ValidationReport, findings: list[Any]) -> None:
        res = _one(report, "stress", f"{NODE}/gpu{GPU}")
        assert reason in res.details["reasons_seen"], res.details["reasons_seen"]
        assert reason in res.message

    return check


def _memory_addresses(report: ValidationReport, findings: list[Any]) -> None:
    res = _one(report, "memory", f"{NODE}/gpu{GPU}")
    assert len(res.details["addresses"]) == 4
    assert all(a.startswith("0x") and a in res.message for a in res.details["addresses"])


def _straggler(report: ValidationReport, findings: list[Any]) -> None:
    lines = [s for s in report.stragglers if s.component == f"{NODE}/gpu{GPU}"]
    assert len(lines) == 1 and len(report.stragglers) == 1, report.stragglers
    assert -23 < lines[0].deviation_pct < -17  # 80 % of its peers, +-1 % spread


def _names_link(report: ValidationReport, findings: list[Any]) -> None:
    bad = {r.component for r in report.results if r.test == "pairwise" and r.status is Status.FAIL}
    assert bad == {"sim-01<->sim-02"}
    assert report.pair_matrix["sim-01"]["sim-02"] < 0.55 * report.pair_matrix["sim-01"]["sim-03"]


def _nvlink_link_named(report: ValidationReport, findings: list[Any]) -> None:
    ours = [f for f in findings if f.code.startswith("NVLINK_")]
    assert ours and all("NVLink 3" in f.message and f.evidence["link"] == 3 for f in ours)


COVERAGE: dict[FaultKind, Row] = {
    FaultKind.XID: Row(
        {"xid": 79},
        Severity.FAIL,
        frozenset({"XID_79"}),
        ((1, "health_rules", Status.FAIL),),
    ),
    FaultKind.ECC_DBE: Row(
        {"count": 1},
        Severity.FAIL,
        frozenset({"ECC_DBE_VOLATILE"}),
        ((1, "health_rules", Status.FAIL),),
    ),
    FaultKind.ROW_REMAP_FAILURE: Row(
        {},
        Severity.FAIL,
        frozenset({"ROW_REMAP_FAILURE"}),
        ((1, "row_remap", Status.FAIL), (1, "health_rules", Status.FAIL)),
    ),
    FaultKind.RETIRED_PAGES: Row(
        {"sbe": 70},
        Severity.FAIL,
        frozenset({"RETIRED_PAGES_LIMIT"}),
        ((1, "retired_pages", Status.FAIL), (1, "health_rules", Status.FAIL)),
        spec="1x8xa100-sxm4-80gb",
    ),
    FaultKind.FALLEN_OFF_BUS: Row(
        {},
        Severity.FAIL,
        frozenset({"GPU_LOST", "XID_79"}),
        ((1, "health_rules", Status.FAIL), (1, "ecc", Status.FAIL)),
    ),
    FaultKind.HUNG_CALL: Row(
        {"seconds": 3600},
        Severity.FAIL,
        frozenset({"GPU_NVML_TIMEOUT"}),
        ((1, "health_rules", Status.FAIL), (1, "ecc", Status.FAIL)),
    ),
    FaultKind.ECC_SBE: Row(
        {"rate_per_min": 600},
        Severity.WARN,
        frozenset({"ECC_SBE_RATE"}),
        ((1, "health_rules", Status.WARN),),
    ),
    FaultKind.ROW_REMAP_PENDING: Row(
        {},
        Severity.WARN,
        frozenset({"ROW_REMAP_PENDING"}),
        ((1, "row_remap", Status.WARN), (1, "health_rules", Status.WARN)),
    ),
    FaultKind.PCIE_REPLAYS: Row(
        {"rate_per_min": 600},
        Severity.WARN,
        frozenset({"PCIE_REPLAY_RATE"}),
        ((1, "health_rules", Status.WARN),),
    ),
    FaultKind.PERSISTENCE_OFF: Row(
        {},
        Severity.WARN,
        frozenset({"PERSISTENCE_MODE_OFF"}),
        ((1, "persistence", Status.WARN), (1, "health_rules", Status.WARN)),
    ),
    FaultKind.ECC_DISABLED: Row(
        {},
        Severity.WARN,
        frozenset({"ECC_DISABLED"}),
        ((1, "ecc", Status.FAIL),),
    ),
    FaultKind.PCIE_DOWNGRADE: Row(
        {"width": 8},
        Severity.WARN,
        frozenset({"PCIE_WIDTH_DOWNGRADED"}),
        ((1, "pcie_link", Status.FAIL), (2, "pcie_bandwidth", Status.FAIL)),
    ),
    FaultKind.THERMAL_SLOWDOWN: Row(
        {},
        Severity.WARN,
        frozenset({"HW_THERMAL_SLOWDOWN"}),
        ((3, "stress", Status.FAIL),),
        more=_stress_names("HW thermal"),
    ),
    FaultKind.HW_POWER_BRAKE: Row(
        {},
        Severity.WARN,
        frozenset({"HW_POWER_BRAKE"}),
        ((3, "stress", Status.FAIL),),
        more=_stress_names("HW power brake"),
    ),
    FaultKind.SLOW_GPU: Row(
        {"fraction": 0.8},
        validate=((2, "matmul", Status.FAIL),),
        more=_straggler,
    ),
    FaultKind.MEMORY_ERRORS: Row(
        {"count": 4},
        validate=((2, "memory", Status.FAIL),),
        more=_memory_addresses,
    ),
    FaultKind.SLOW_LINK: Row(
        {"fraction": 0.5, "peer": "sim-02"},
        validate=((3, "pairwise", Status.FAIL),),
        more=_names_link,
        spec="4x8xh200",
        node="sim-01",
    ),
    FaultKind.NVLINK_ERRORS: Row(
        {"link": 3},
        Severity.WARN,
        frozenset({"NVLINK_CRC_ERRORS"}),
        ((1, "health_rules", Status.WARN), (2, "nvlink_p2p", Status.FAIL)),
        more=_nvlink_link_named,
    ),
    FaultKind.UPDATE_NO_RETURN: Row(campaign="back"),
    FaultKind.UPDATE_OLD_VERSION: Row(campaign="verify"),
    FaultKind.UPDATE_FAILS_VALIDATION: Row(
        health=Severity.FAIL, health_codes=frozenset({"ECC_DBE_VOLATILE"}), campaign="validate"
    ),
    FaultKind.UPDATE_GPU_LOST: Row(
        health=Severity.FAIL, health_codes=frozenset({"GPU_LOST", "XID_79"}), campaign="validate"
    ),
}


def _one(report: ValidationReport, test: str, component: str) -> TestResult:
    found = [r for r in report.results if r.test == test and r.component == component]
    assert len(found) == 1, (test, component, [r.component for r in report.results])
    return found[0]


def test_every_fault_kind_has_a_row() -> None:
    assert set(COVERAGE) == set(FaultKind), sorted(set(FaultKind) ^ set(COVERAGE))


def _fleet(row: Row, kind: FaultKind) -> tuple[SimFleet, ManualClock]:
    clock = ManualClock()
    fleet = SimFleet(parse_fleet_spec(row.spec, seed=4), clock=clock)
    gpu = None if kind is FaultKind.SLOW_LINK else GPU
    fleet.inject(Fault(kind, node=row.node, gpu=gpu, params=dict(row.params)))
    return fleet, clock


def _release_hangs(fleet: SimFleet) -> None:
    for node in fleet.nodes.values():
        for g in node.gpus:
            g.hang_release.set()


@pytest.mark.parametrize("kind", list(FaultKind), ids=lambda k: k.value)
def test_fault_is_caught_by_its_detectors(kind: FaultKind) -> None:
    row = COVERAGE.get(kind)
    assert row is not None, f"fault kind {kind.value!r} has no row in the coverage table"
    if row.campaign is not None:
        return  # an update fault acts through the simulated update: `test_update_fault...`
    findings: list[Any] = []
    fleet, clock = _fleet(row, kind)
    fleets = [fleet]
    try:
        if row.health is not None:
            backend = fleet.node(row.node).backend()
            data = collect_node(
                backend, duration_s=3.0, sleep=clock.advance, clock=clock, nvml_timeout_s=0.5
            )
            health = HealthTracker(None, clock=clock).evaluate(data)
            findings = [f for f in health.findings if f.gpu_index == GPU]
            worst = max((f.severity for f in findings), default=Severity.OK)
            assert worst >= row.health, [(f.code, f.severity) for f in health.findings]
            assert row.health_codes & {f.code for f in findings}, [f.code for f in findings]
            others = {f.gpu_index for f in health.findings if f.code in row.health_codes}
            assert others == {GPU}, others  # names the right GPU only
        if not row.validate:
            return
        fleet, clock = _fleet(row, kind)  # a fresh fleet: validate starts from scratch
        fleets.append(fleet)
        level = max(level for level, _, _ in row.validate)
        engine = SimEngine(fleet, clock)
        if kind is FaultKind.HUNG_CALL:  # a short NVML deadline keeps the case quick
            engine._backends = {n: with_deadlines(b, 0.5) for n, b in engine._backends.items()}
        multi = len(fleet.nodes) > 1
        tests = select_tests(level, multi_node=multi)
        report = run_suite(
            engine, RunOptions(tests=tests, level=level, stress_s=30.0, power_s=10.0)
        )
        gpu_component = f"{row.node}/gpu{GPU}"
        for _level, test, status in row.validate:
            results = [r for r in report.results if r.test == test]
            assert results, f"{test} did not run"
            if test == "pairwise":
                continue  # attributed to the link (checked in `more`)
            mine = [r for r in results if r.component == gpu_component]
            assert mine, (test, [r.component for r in results])
            got = max(RANK[r.status] for r in mine)
            assert got >= RANK[status], (test, [(r.status, r.message) for r in mine])
            elsewhere = [
                r.component
                for r in results
                if RANK[r.status] >= RANK[status] and gpu_component not in r.component
            ]
            assert elsewhere == [], (test, elsewhere)  # names the right GPU only
        assert report.exit_code != 0
        if row.more is not None:
            row.more(report, findings)
    finally:
        for f in fleets:
            _release_hangs(f)


@pytest.mark.parametrize(
    "kind", [k for k in FaultKind if COVERAGE[k].campaign], ids=lambda k: k.value
)
def test_update_fault_is_caught(kind: FaultKind) -> None:
    """The simulated update (`gpufleet.devices.sim.update`) with the fault: the versions stay
    old (the campaign's verify step sees it), the node hangs (it never comes back), or the
    restarted node carries a fault its level-1 validation fails on the right GPU (the health
    detectors of the agent's gate, run here on the fleet file the agent would read)."""
    from gpufleet.devices.sim.update import apply_update

    row = COVERAGE[kind]
    doc = {
        "nodes": [{"name": NODE, "model": "h200", "gpus": 8, "driver_version": "535.104.05"}],
        "faults": [{"kind": kind.value, "node": NODE, "gpu": GPU}],
    }
    new, hang = apply_update(doc, NODE, "550.90.07", None)
    assert "faults" not in new or all(f["kind"] != kind.value for f in new["faults"])
    driver = new["nodes"][0]["driver_version"]
    if row.campaign == "back":
        assert hang and driver == "535.104.05"
        return
    assert not hang
    if row.campaign == "verify":
        assert driver == "535.104.05"  # the baseline wants 550.90.07: verify fails the node
        return
    assert driver == "550.90.07"
    from gpufleet.devices.sim.spec import parse_fleet_yaml

    clock = ManualClock()
    fleet = SimFleet(parse_fleet_yaml(json.dumps(new), "fleet.yaml"), clock=clock)
    backend = fleet.node(NODE).backend()
    data = collect_node(backend, duration_s=3.0, sleep=clock.advance, clock=clock)
    health = HealthTracker(None, clock=clock).evaluate(data)
    bad = [f for f in health.findings if f.severity >= Severity.FAIL]
    assert {f.gpu_index for f in bad} == {GPU}, [(f.code, f.gpu_index) for f in bad]
    assert row.health_codes & {f.code for f in bad}
