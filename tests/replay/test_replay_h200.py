"""The production NVML path (pynvml's own functions, `NvmlBackend`, the agent's sampler and the
CLI) against a replay of what a real H200 answered (``tests/fixtures/nvidia-h200``).

Expected figures are read from the capture files, not from gpufleet's output."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pynvml
import pytest
from typer.testing import CliRunner

from gpufleet.cli.app import app
from gpufleet.devices.nvml import NvmlBackend
from gpufleet.devices.sim import ManualClock
from gpufleet.telemetry.exposition import AgentCollector, HealthView, make_registry, render_text
from gpufleet.telemetry.sampler import Sampler
from tests.replay.nvml_replay import H200, ReplayLibrary, install_replay

runner = CliRunner()
PROBE: dict[str, Any] = json.loads((H200 / "nvml_probe.json").read_text())
DEV: dict[str, Any] = PROBE["devices"][0]
FIELDS: dict[str, Any] = PROBE["fieldValues"]

# What the production path asks for that this capture does not hold, decided from the capture:
# the probe called nvmlDeviceGetMemoryInfo without a version (v1 symbol only) and could not call
# nvmlDeviceGetTemperatureV (it needs a sensor argument: "TypeError" in nvml_probe.json).
UNRECORDED = {"nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTemperatureV"}


@pytest.fixture
def replay() -> Iterator[ReplayLibrary]:
    with install_replay(ReplayLibrary.from_dir()) as lib:
        yield lib


def _value(name: str, key: str | None = None) -> Any:
    entry = DEV[name] if key is None else DEV[name][key]
    assert entry["ok"], entry
    return entry["value"]


def test_every_call_the_backend_makes_is_recorded_but_the_known_gaps(
    replay: ReplayLibrary,
) -> None:
    backend = NvmlBackend(lib=pynvml, node_name="h200")
    try:
        backend.device_info(0)
        for _ in range(2):
            backend.sample(0)
            backend.sample_gpm(0)
        backend.poll_events()
        backend.running_processes(0)
        backend.mig_instances(0)
    finally:
        backend.close()
    print("calls the capture never recorded:", sorted(replay.unrecorded))
    assert replay.unrecorded == UNRECORDED
    assert replay.unrecorded_fields == set()


def test_identity_and_readings_are_the_captured_ones(replay: ReplayLibrary) -> None:
    backend = NvmlBackend(lib=pynvml, node_name="h200")
    try:
        info = backend.device_info(0)
        s = backend.sample(0)
        gpm = [backend.sample_gpm(0) for _ in range(2)][-1]
    finally:
        backend.close()
    assert info.uuid == _value("nvmlDeviceGetUUID")
    assert info.model == "h200-sxm"
    assert info.memory_total_bytes == _value("nvmlDeviceGetMemoryInfo")["total"]
    assert info.slowdown_temp_c == _value("nvmlDeviceGetTemperatureThreshold", "(1,)")
    assert info.shutdown_temp_c == _value("nvmlDeviceGetTemperatureThreshold", "(0,)")
    assert s.gpu_temp_c == _value("nvmlDeviceGetTemperature", "(0,)")
    assert s.sm_clock_mhz == _value("nvmlDeviceGetClockInfo", "(1,)")
    assert s.energy_mj == FIELDS["NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]["value"]
    assert gpm is not None and gpm["prof_gr_engine_active"] == 0.0


def test_memory_falls_back_to_the_v1_struct_per_call_and_says_so(
    replay: ReplayLibrary, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 14 item 12: the v2 symbol is missing from this capture."""
    v1 = _value("nvmlDeviceGetMemoryInfo")
    backend = NvmlBackend(lib=pynvml, node_name="h200")
    with caplog.at_level(logging.WARNING, logger="gpufleet.devices.nvml.backend"):
        try:
            first, second = backend.sample_fast(0), backend.sample_fast(0)
        finally:
            backend.close()
    for s in (first, second):
        assert (s.mem_used_bytes, s.mem_free_bytes) == (v1["used"], v1["free"])
    assert any("nvmlDeviceGetMemoryInfo_v2" in p and "v1" in p for p in backend.problems())
    logged = [r for r in caplog.records if "nvmlDeviceGetMemoryInfo_v2" in r.getMessage()]
    assert len(logged) == 1  # once, not per sample
    assert replay.calls["nvmlDeviceGetMemoryInfo"] >= 2


def test_the_agent_exports_memory_power_and_pcie_from_the_replay(replay: ReplayLibrary) -> None:
    """Items 12, 13, 16 as the agent's /metrics shows them."""
    clock = ManualClock()
    sampler = Sampler(NvmlBackend(lib=pynvml, node_name="h200"), clock=clock)
    try:
        for _ in range(3):
            sampler.tick()
            clock.advance(1)
        sampler.tick()
        text = render_text(
            make_registry(
                AgentCollector(sampler, hostname="h200", health=lambda: HealthView(node=0, gpus={}))
            )
        ).decode()
    finally:
        sampler.close()
    values = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("DCGM_FI_")
    }
    mem = _value("nvmlDeviceGetMemoryInfo")
    assert values["DCGM_FI_DEV_FB_USED"] == mem["used"] // 2**20
    assert values["DCGM_FI_DEV_FB_FREE"] == mem["free"] // 2**20
    # dcgm-exporter's DCGM_FI_DEV_POWER_USAGE: the 1 s average; instant power under its own name
    assert values["DCGM_FI_DEV_POWER_USAGE"] == FIELDS["NVML_FI_DEV_POWER_AVERAGE"]["value"] / 1e3
    instant = FIELDS["NVML_FI_DEV_POWER_INSTANT"]["value"] / 1e3
    assert values["DCGM_FI_DEV_POWER_USAGE_INSTANT"] == instant


def test_pcie_throughput_comes_from_the_throughput_getter(replay: ReplayLibrary) -> None:
    """Item 13: the 32-bit byte counters (field ids 197/198, valueType 1) cannot give a rate."""
    assert (
        FIELDS["NVML_FI_DEV_PCIE_COUNT_TX_BYTES"]["valueType"]
        == pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    )
    backend = NvmlBackend(lib=pynvml, node_name="h200")
    try:
        s = backend.sample_slow(0)
    finally:
        backend.close()
    tx_kb = _value("nvmlDeviceGetPcieThroughput", f"({pynvml.NVML_PCIE_UTIL_TX_BYTES},)")
    rx_kb = _value("nvmlDeviceGetPcieThroughput", f"({pynvml.NVML_PCIE_UTIL_RX_BYTES},)")
    assert (s.pcie_tx_bytes_per_s, s.pcie_rx_bytes_per_s) == (tx_kb * 1024, rx_kb * 1024)


def test_deprecated_getters_give_way_to_their_successors(replay: ReplayLibrary) -> None:
    """Item 16: violation times come from field ids 74/75 (nvmlDeviceGetViolationStatus is not
    called while they answer); TemperatureV is tried first, nvmlDeviceGetTemperature answers."""
    backend = NvmlBackend(lib=pynvml, node_name="h200")
    try:
        s = backend.sample(0)
    finally:
        backend.close()
    assert "nvmlDeviceGetViolationStatus" not in replay.calls
    assert s.power_violation_us == FIELDS["NVML_FI_DEV_CLOCKS_EVENT_REASON_SW_POWER_CAP"]["value"]
    assert "nvmlDeviceGetTemperatureV" in replay.unrecorded
    assert s.gpu_temp_c == _value("nvmlDeviceGetTemperature", "(0,)")


def test_an_older_driver_without_the_v3_process_symbol() -> None:
    """Item 14: pynvml raises NVMLLibraryMismatchError (not an NVMLError) from the unversioned
    wrapper; the backend treats it as FunctionNotFound and asks the _v2 symbol."""
    old = ReplayLibrary.from_dir(without=frozenset({"nvmlDeviceGetComputeRunningProcesses_v3"}))
    with install_replay(old):
        pynvml.nvmlInit()
        try:
            with pytest.raises(pynvml.NVMLLibraryMismatchError):
                pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0))
        finally:
            pynvml.nvmlShutdown()
        backend = NvmlBackend(lib=pynvml, node_name="h200-old")
        try:
            assert backend.running_processes(0) == _value("nvmlDeviceGetComputeRunningProcesses_v2")
            assert old.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 1
            assert any("ComputeRunningProcesses" in p for p in backend.problems())
        finally:
            backend.close()


def _cli(*args: str) -> tuple[int, Any]:
    result = runner.invoke(app, [*args, "--json"])
    return result.exit_code, json.loads(result.stdout)


def test_doctor_over_the_replay_names_the_memory_fallback(replay: ReplayLibrary) -> None:
    # the NVML checks over the capture; the host readiness checks read this machine instead
    code, doc = _cli("doctor", "--no-readiness")
    checks = [c for n in doc["nodes"] for c in n["checks"]]
    calls = [c for c in checks if c["name"] == "nvml_call"]
    assert any("nvmlDeviceGetMemoryInfo_v2" in c["detail"] for c in calls)
    assert all(c["status"] == "warn" for c in calls)
    assert {c["name"]: c["status"] for c in checks}["gpu_config"] == "ok"
    assert code == 1  # warnings


def test_health_inventory_and_status_over_the_replay(replay: ReplayLibrary) -> None:
    code, health = _cli("health", "--duration", "0")
    assert code == 0, health
    assert health["verdict"] == "ok"
    code, inventory = _cli("inventory")
    assert code == 0
    gpu = inventory["nodes"][0]["gpus"][0]
    assert (gpu["uuid"], gpu["model"]) == (_value("nvmlDeviceGetUUID"), "h200-sxm")
    assert (
        inventory["nodes"][0]["driver_version"]
        == PROBE["system"]["nvmlSystemGetDriverVersion"]["value"]
    )
    code, status = _cli("status")
    assert code == 0
    row = status["nodes"][0]["gpus"][0]
    assert row["mem_used_bytes"] == _value("nvmlDeviceGetMemoryInfo")["used"]
    assert row["power_w"] == FIELDS["NVML_FI_DEV_POWER_AVERAGE"]["value"] / 1e3


def test_catalog_and_simulator_thermal_limits_are_the_real_h200s() -> None:
    """Item 15: the simulator's H200 answers the thresholds the real one did."""
    from gpufleet.devices.sim import SimFleet, parse_fleet_spec

    fleet = SimFleet(parse_fleet_spec("1x1xh200"), clock=ManualClock())
    backend = next(iter(fleet.nodes.values())).backend()
    try:
        info = backend.device_info(0)
    finally:
        backend.close()
    thresholds = DEV["nvmlDeviceGetTemperatureThreshold"]
    assert (
        info.slowdown_temp_c
        == thresholds[f"({pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN},)"]["value"]
    )
    assert (
        info.shutdown_temp_c
        == thresholds[f"({pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN},)"]["value"]
    )
