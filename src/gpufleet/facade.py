"""What the CLI does, as plain calls: the functions ``import gpufleet`` exports.

Open GPUs (``open_nvml``, ``open_sim``), read them (``sample``), judge them
(``check_health``, ``run_validation``), plan a cluster (``plan_cluster``) or MIG layouts
(``plan_mig``). Each function is a thin wiring of the packages below it, the same wiring the CLI
commands use, so a script and the CLI get the same answers. Heavy modules (NVML, the simulator,
numpy, the validation engines) are imported when a function is called, never when this module
is imported.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpufleet.errors import DeviceError, GpuLostError, UsageError

if TYPE_CHECKING:
    from gpufleet.devices.discovery import Fleet
    from gpufleet.devices.types import DeviceInfo, Sample
    from gpufleet.health.tracker import HealthReport
    from gpufleet.mig.planner import MigPlan
    from gpufleet.plan.planner import Plan
    from gpufleet.validate.results import ValidationReport


@dataclass(frozen=True)
class GpuReading:
    """One GPU read once: its identity and newest sample, or the error that prevented it."""

    node: str
    index: int
    info: DeviceInfo | None
    sample: Sample | None
    error: str | None = None


def open_nvml() -> Fleet:
    """This machine's GPUs through NVML (one backend). Raises ``NoDeviceError`` without any.

    Close the fleet (``fleet.close()``) when done: it shuts NVML down.
    """
    from gpufleet.devices.discovery import open_local_nvml

    return open_local_nvml()


def open_sim(spec: str | Path, *, seed: int = 7, manual_clock: bool = True) -> Fleet:
    """A simulated fleet that speaks NVML, e.g. ``open_sim("2x8xh100")``.

    ``spec`` is the CLI's ``--sim`` value: ``NODESxGPUSxMODEL`` or the path of a YAML fleet
    file (nodes, racks, injected faults); ``seed`` makes noise and faults repeatable. With
    ``manual_clock`` (the default) simulated time only moves when a call advances it
    (``check_health`` and ``run_validation`` do), so a 3-second health window costs no wall
    time; ``manual_clock=False`` follows the wall clock.
    """
    from gpufleet.devices.discovery import Fleet
    from gpufleet.devices.sim import ManualClock, SimFleet, parse_fleet_spec

    clock = ManualClock() if manual_clock else None
    sim = SimFleet(parse_fleet_spec(str(spec), seed=seed), clock=clock)
    return Fleet(kind="sim", backends=list(sim.backends()), sim=sim)


def sample(
    fleet: Fleet, infos: dict[tuple[str, int], DeviceInfo] | None = None
) -> list[GpuReading]:
    """Read every GPU of ``fleet`` once (``gpufleet status``); a lost GPU is a row with its error.

    Pass the same ``infos`` dict on repeated calls to read each GPU's identity only once.
    """
    known = infos if infos is not None else {}
    rows: list[GpuReading] = []
    for backend in fleet.backends:
        for i in range(backend.device_count()):
            key = (backend.node_name, i)
            try:
                if key not in known:
                    known[key] = backend.device_info(i)
                rows.append(GpuReading(backend.node_name, i, known[key], backend.sample(i)))
            except (GpuLostError, DeviceError) as exc:
                rows.append(GpuReading(backend.node_name, i, known.get(key), None, str(exc)))
    for inv, samples in fleet.imported:
        for info, s in zip(inv.gpus, samples, strict=False):
            rows.append(GpuReading(inv.name, info.index, info, s))
    return rows


def _manual_clock(fleet: Fleet) -> Any:
    """The simulated fleet's manual clock, or None (real GPUs, or a sim on the wall clock)."""
    if fleet.sim is None:
        return None
    from gpufleet.devices.sim import ManualClock

    clock = fleet.sim.clock
    return clock if isinstance(clock, ManualClock) else None


def check_health(
    fleet: Fleet, *, duration_s: float = 3.0, config: Path | None = None
) -> list[HealthReport]:
    """Sample each node of ``fleet`` for ``duration_s`` and judge it (``gpufleet health``).

    One ``HealthReport`` per node: a verdict (ok, warn, fail, unknown), findings with evidence
    and the recommended action. ``config`` is a YAML file with a ``health:`` section.
    Acknowledgements and sticky findings are kept in memory for this call only.
    """
    from gpufleet.health.collect import collect_node
    from gpufleet.health.config import load_health_config
    from gpufleet.health.tracker import HealthTracker

    if duration_s < 0:
        raise UsageError("duration_s must be >= 0")
    cfg = load_health_config(config)
    clock = _manual_clock(fleet)
    sleep: Callable[[float], object] = clock.advance if clock is not None else time.sleep
    now: Callable[[], float] = clock if clock is not None else time.time
    reports = []
    for backend in fleet.backends:
        data = collect_node(backend, duration_s=duration_s, sleep=sleep)
        reports.append(HealthTracker(cfg, clock=now).evaluate(data))
    return reports


def run_validation(
    fleet: Fleet,
    *,
    level: int = 1,
    only: list[str] | None = None,
    skip: list[str] | None = None,
    stress_s: float = 900.0,
    thresholds: Path | None = None,
) -> ValidationReport:
    """Run the validation suite (``gpufleet validate``) and return its report.

    A simulated fleet (from ``open_sim``, manual clock) runs on the simulation engine in no wall
    time; real GPUs run on PyTorch (the ``torch`` extra). ``level`` 1 is quick checks, 2 adds
    bandwidth, memory and matmul tests, 3 adds stress and collectives. ``report.status`` is the
    overall result, ``report.results`` each test on each component.
    """
    from gpufleet.validate.engines import open_engine
    from gpufleet.validate.runner import RunOptions, run_suite
    from gpufleet.validate.suite import select_tests
    from gpufleet.validate.thresholds import load_thresholds

    if stress_s <= 0:
        raise UsageError("stress_s must be positive")
    engine: Any
    if fleet.kind == "sim":
        from gpufleet import simvalidate  # noqa: F401  (registers the "sim" engine)

        clock = _manual_clock(fleet)
        if clock is None:
            raise UsageError("run_validation: open the simulated fleet with open_sim(...)")
        engine = open_engine("sim", fleet=fleet.sim, clock=clock)
    elif fleet.kind == "nvml":
        engine = open_engine("torch")
    else:
        raise UsageError(f"cannot validate a fleet of kind {fleet.kind!r} (imported reports)")
    multi = len(engine.backends()) > 1
    opts = RunOptions(
        tests=select_tests(level, only or [], skip or [], multi_node=multi),
        level=level,
        stress_s=stress_s,
        power_s=min(120.0, stress_s),
        thresholds=load_thresholds(thresholds),
    )
    return run_suite(engine, opts)


def plan_cluster(spec: str | Path | dict[str, Any]) -> Plan:
    """Size and cost a cluster for a workload spec (``gpufleet plan``).

    ``spec`` is YAML text, a path to a YAML file, or an already-parsed mapping (the same
    schema as ``gpufleet plan``'s spec files). ``.best`` of the answer is the recommended
    candidate.
    """
    from gpufleet.plan.planner import plan as make_plan
    from gpufleet.plan.spec import load_spec

    if isinstance(spec, Path):
        try:
            text = spec.read_text(encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"{spec}: cannot read: {exc.strerror or exc}") from exc
        return make_plan(load_spec(text, name=str(spec)))
    return make_plan(load_spec(spec))


def plan_mig(gpus: str, demand: str, *, time_limit_s: float = 60.0) -> MigPlan:
    """Pack MIG instances onto GPUs (``gpufleet mig plan --gpus ... --demand ...``).

    ``gpus`` is ``[NODES x] GPUS x MODEL`` (e.g. ``"2x8xh100"``); ``demand`` is
    ``[TENANT:] N x PROFILE, ...`` (e.g. ``"4x3g.40gb, 10x1g.10gb"``). The plan is exact (an ILP
    solved within ``time_limit_s``); ``.summary()`` gives placed and stranded slices.
    """
    from gpufleet.mig.demand import parse_demand
    from gpufleet.mig.fleet import parse_gpus
    from gpufleet.mig.layouts import profile_names
    from gpufleet.mig.planner import plan_exact

    fleet = parse_gpus(gpus, source="gpus")
    known = profile_names(g.model for g in fleet)
    if not known:
        raise UsageError(f"gpus: none of {gpus!r} supports MIG")
    return plan_exact(
        fleet, parse_demand(demand, known, source="demand"), time_limit_s=time_limit_s
    )
