"""A GPU lost when the agent starts still exports ``gpufleet_gpu_lost`` (under the labels it
had before the restart), and promtool's rule unit tests prove that ``GpufleetGpuLost`` fires
for it and keeps firing across an agent restart (issue 18).

The input series promtool evaluates are built from the real agent's /metrics text (sampler on
the simulator, the agent's collector, its identity memory in a state directory), so the test
fails when the exposition drops the series or changes its labels across the restart."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from gpufleet.cli.config_prometheus import rules_doc
from gpufleet.cli.prometheus_rule_tests import gpu_lost_text
from gpufleet.devices.sim import Fault, FaultKind, ManualClock
from gpufleet.telemetry.exposition import (
    AgentCollector,
    IdentityMemory,
    make_registry,
    render_text,
)
from gpufleet.telemetry.sampler import Sampler
from tests.agent.conftest import need_binary, sim_node

_LINE = re.compile(r"^([A-Za-z_:][\w:]*)\{(.*)\} (\S+)$")
INSTANCE = "node-a:9400"


def lost_series(memory: Path, *, lost_at_start: bool) -> dict[str, dict[str, str]]:
    """Scrape one agent (the simulator's node, 2 GPUs) whose GPU 1 falls off the bus (at once
    when ``lost_at_start``, else after 3 s) and return the gpufleet_gpu_lost series by value
    ("0"/"1") -> labels of GPU 1."""
    clock = ManualClock()
    fleet, node = sim_node("1x2xh100", clock)
    fleet.inject(Fault(FaultKind.FALLEN_OFF_BUS, gpu=1, at_s=0.0 if lost_at_start else 3.0))
    sampler = Sampler(node.backend(), clock=clock)
    collector = AgentCollector(sampler, hostname="node-a", identities=IdentityMemory(memory))
    registry = make_registry(collector)
    try:
        for _ in range(6):
            sampler.tick()
            render_text(registry)  # every scrape, as Prometheus would
            clock.advance(1)
        sampler.tick()
        text = render_text(registry).decode()
    finally:
        sampler.close()
    out: dict[str, dict[str, str]] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and m.group(1) == "gpufleet_gpu_lost":
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2)))
            out[labels["gpu"]] = labels | {"value": m.group(3)}
    return out


def series_key(labels: dict[str, str]) -> str:
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "value")
    return f'gpufleet_gpu_lost{{{inner}, instance="{INSTANCE}", job="gpufleet-agent"}}'


def run_promtool(tmp_path: Path, series: dict[str, str], alerts: list[dict[str, object]]) -> str:
    promtool = need_binary("promtool")
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(rules_doc(), sort_keys=False), encoding="utf-8")
    test = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": k, "values": v} for k, v in series.items()],
                "alert_rule_test": alerts,
            }
        ],
    }
    path = tmp_path / "test.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    out = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_lost_at_start_gpu_exports_the_labels_it_had(tmp_path: Path) -> None:
    memory = tmp_path / "state" / "gpu-identities.json"
    memory.parent.mkdir()
    before = lost_series(memory, lost_at_start=False)
    assert before["1"]["value"] == "1" and before["0"]["value"] == "0"
    assert before["1"]["UUID"].startswith("GPU-")  # identified before it fell off
    assert memory.stat().st_mode & 0o777 == 0o600
    after = lost_series(memory, lost_at_start=True)  # the agent restarts; GPU 1 stays lost
    assert after["1"]["value"] == "1"
    assert {k: v for k, v in after["1"].items()} == before["1"]
    # never seen identified (a new state directory): the series is there all the same,
    # with what is known of it, and no UUID, model or PCI address made up
    fresh = lost_series(tmp_path / "other.json", lost_at_start=True)
    assert fresh["1"] == {"gpu": "1", "device": "nvidia1", "Hostname": "node-a", "value": "1"}
    # a remembered identity another GPU now answers to (indices shifted) is not used
    shifted = tmp_path / "shifted.json"
    gpu0 = {k: v for k, v in before["0"].items() if k != "value"}
    shifted.write_text(json.dumps({"1": gpu0}), encoding="utf-8")
    assert lost_series(shifted, lost_at_start=True)["1"] == fresh["1"]


@pytest.mark.process
def test_gpu_lost_alert_fires_and_stays_firing_across_an_agent_restart(tmp_path: Path) -> None:
    memory = tmp_path / "gpu-identities.json"
    before = lost_series(memory, lost_at_start=False)["1"]
    after = lost_series(memory, lost_at_start=True)["1"]
    # minutes 0-1 healthy, 2-6 lost, 7-9 the agent restarts (the failed scrape at 7 marks
    # its series stale, as Prometheus does; then no samples), 10-29 the restarted agent
    # exports the GPU lost from its start
    series: dict[str, list[str]] = {}
    for minute in range(30):
        for labels, live in ((before, minute < 7), (after, minute >= 10)):
            values = series.setdefault(series_key(labels), ["_"] * 30)
            if live:
                values[minute] = "0" if minute < 2 else labels["value"]
            elif minute == 7 and labels is before:
                values[minute] = "stale"
    up = ["1"] * 7 + ["0"] * 3 + ["1"] * 20
    inputs = {k: " ".join(v) for k, v in series.items()}
    inputs[f'up{{instance="{INSTANCE}", job="gpufleet-agent"}}'] = " ".join(up)
    labels = {
        "instance": INSTANCE,
        "Hostname": "node-a",
        "gpu": "1",
        "UUID": before["UUID"],
        "severity": "critical",
        "scope": "gpu",
    }
    firing = [
        {
            "exp_labels": labels,
            "exp_annotations": gpu_lost_text("1", uuid=before["UUID"], host="node-a"),
        }
    ]
    run_promtool(
        tmp_path,
        inputs,
        [
            {"eval_time": "1m", "alertname": "GpufleetGpuLost", "exp_alerts": []},
            {"eval_time": "3m", "alertname": "GpufleetGpuLost", "exp_alerts": firing},
            # the restart: no sample at all, the alert is held by keep_firing_for
            {"eval_time": "9m", "alertname": "GpufleetGpuLost", "exp_alerts": firing},
            # the restarted agent: one alert, the same one (same labels), still firing
            {"eval_time": "12m", "alertname": "GpufleetGpuLost", "exp_alerts": firing},
            {"eval_time": "29m", "alertname": "GpufleetGpuLost", "exp_alerts": firing},
        ],
    )


@pytest.mark.process
def test_gpu_lost_at_first_start_fires(tmp_path: Path) -> None:
    """The case that never fired before: the GPU was lost before the agent ever saw it."""
    lost = lost_series(tmp_path / "none.json", lost_at_start=True)["1"]
    inputs = {series_key(lost): "1x10"}
    run_promtool(
        tmp_path,
        inputs,
        [
            {
                "eval_time": "2m",
                "alertname": "GpufleetGpuLost",
                "exp_alerts": [
                    {
                        "exp_labels": {
                            "instance": INSTANCE,
                            "Hostname": "node-a",
                            "gpu": "1",
                            "severity": "critical",
                            "scope": "gpu",
                        },
                        # no UUID known: the description names the index and the host
                        "exp_annotations": gpu_lost_text("1", uuid=None, host="node-a"),
                    }
                ],
            }
        ],
    )
