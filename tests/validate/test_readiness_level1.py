"""Validate level 1 includes the host readiness checks (issue 17): judged on a real host,
skipped with the reason on simulated nodes (they are not this host)."""

from __future__ import annotations

from gpufleet.devices.sim import SimFleet, parse_fleet_spec
from gpufleet.validate.results import Status
from gpufleet.validate.runner import _readiness
from gpufleet.validate.suite import select_tests
from tests.validate.conftest import run_sim


def test_level1_lists_readiness_and_skips_it_on_simulated_nodes() -> None:
    assert "readiness" in select_tests(1)
    report = run_sim("2x2xh100-sxm", level=1)
    rows = [r for r in report.results if r.test == "readiness"]
    assert [(r.component, r.status) for r in rows] == [
        ("sim-00", Status.SKIP),
        ("sim-01", Status.SKIP),
    ]
    assert report.status is Status.PASS  # a skip never fails a run


def test_on_a_real_host_every_phase_is_judged() -> None:
    """This machine (no GPU, no NVIDIA driver): the checks run against its real /proc and /sys
    and give a verdict with every phase in the details, never a crash."""
    backend = SimFleet(parse_fleet_spec("1x1xh100-sxm")).backends()[0]
    result = _readiness("nvml", "this-host", backend)
    assert result.test == "readiness" and result.component == "this-host"
    phases = {name.split("/")[0] for name in result.details}
    assert {"driver", "cuda", "containers", "gpudirect", "network", "host"} <= phases
    # no NVIDIA kernel module here: the driver phase cannot pass
    assert result.status in (Status.WARN, Status.FAIL)
    assert "driver/" in result.message
