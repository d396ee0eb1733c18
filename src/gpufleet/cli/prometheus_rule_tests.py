"""Unit tests for the generated alert rules, in promtool's format
(https://prometheus.io/docs/prometheus/latest/configuration/unit_testing_rules/):
``gpufleet config prometheus --rules-out rules.yml --rules-tests-out rules_test.yml`` writes
both, and ``promtool test rules rules_test.yml`` proves each alert fires when it should, with
the labels and words an on-call engineer reads, and stays quiet when it should not.

Each rule has its own test group (its own input series), with at least one evaluation where it
fires and one where it does not. A site that edits a threshold edits the matching case and
runs promtool again. CI runs these against the real promtool (tests/alerts/test_rule_units.py).

The input series carry the agent's real label sets (`gpufleet.telemetry.exposition.gpu_labels`,
dcgm-exporter's order) plus the scrape's ``instance`` and ``job``.
"""

from __future__ import annotations

from typing import Any

INSTANCE = "node-a:9400"
JOB = "gpufleet-agent"
HOST = "node-a"
UUID = "GPU-8c1f2a3e-5b6d-4e7f-9a0b-1c2d3e4f5a6b"
_SCRAPE = {"instance": INSTANCE, "job": JOB}
_GPU = {
    "gpu": "3",
    "UUID": UUID,
    "pci_bus_id": "00000000:1B:00.0",
    "device": "nvidia3",
    "modelName": "NVIDIA H100 80GB HBM3",
    "Hostname": HOST,
    **_SCRAPE,
}
_NODE = {"Hostname": HOST, **_SCRAPE}
# what `max by (instance, Hostname, gpu, UUID)` / `max by (instance, Hostname)` keep
_GPU_KEYED = {"instance": INSTANCE, "Hostname": HOST, "gpu": "3", "UUID": UUID}
_NODE_KEYED = {"instance": INSTANCE, "Hostname": HOST}
_HEALTH_HINT = f"curl http://{INSTANCE}/health for the findings."


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def _alert(labels: dict[str, str], severity: str, scope: str, **annotations: str) -> Any:
    return {
        "exp_labels": {**labels, "severity": severity, "scope": scope},
        "exp_annotations": annotations,
    }


def _at(minute: int, alert: str, *firing: Any) -> dict[str, Any]:
    return {"eval_time": f"{minute}m", "alertname": alert, "exp_alerts": list(firing)}


def _group(series: list[dict[str, str]], *checks: dict[str, Any]) -> dict[str, Any]:
    return {"interval": "1m", "input_series": series, "alert_rule_test": list(checks)}


def _node_groups() -> list[dict[str, Any]]:
    up = _series("up", _SCRAPE, "1 1 0 0 0 0 0 1")
    node = "gpufleet_node_health_status"
    failed = _alert(
        _NODE_KEYED,
        "critical",
        "node",
        summary="node node-a failed its health checks",
        description="Its GPU alerts are held back while this fires; curl "
        f"http://{INSTANCE}/health for the findings of every GPU.",
    )
    lost = "gpufleet_gpu_lost"
    return [
        # the agent stops answering at minute 2: pending for 2 minutes, then pages
        _group(
            [up],
            _at(1, "GpufleetAgentDown"),
            _at(3, "GpufleetAgentDown"),
            _at(
                5,
                "GpufleetAgentDown",
                _alert(
                    _SCRAPE,
                    "critical",
                    "node",
                    summary=f"gpufleet agent {INSTANCE} is not answering",
                ),
            ),
            _at(8, "GpufleetAgentDown"),  # back
        ),
        _group(
            [_series(node, _NODE, "0 0 2 2 2 2 0 0")],
            _at(1, "GpufleetNodeFailed"),
            _at(4, "GpufleetNodeFailed", failed),
            _at(7, "GpufleetNodeFailed"),
        ),
        # a warning pages only after 10 minutes: a passing blip does not
        _group(
            [_series(node, _NODE, "1x3 0x3 1x14")],
            _at(3, "GpufleetNodeWarning"),
            _at(12, "GpufleetNodeWarning"),
            _at(
                18,
                "GpufleetNodeWarning",
                _alert(_NODE_KEYED, "warning", "node", summary="node node-a warns"),
            ),
        ),
        _group(
            [_series(node, _NODE, "0 3x14")],
            _at(5, "GpufleetNodeHealthUnknown"),
            _at(
                13,
                "GpufleetNodeHealthUnknown",
                _alert(
                    _NODE_KEYED,
                    "warning",
                    "node",
                    summary="node node-a: the agent cannot judge its health",
                    description="The agent runs but has no verdict (NVML calls hang or fail).",
                ),
            ),
        ),
        # one GPU lost is a GPU alert; two at once on the node is a node alert
        _group(
            [
                _series(lost, {**_GPU, "gpu": "0", "device": "nvidia0"}, "0 1 1 1 1 1"),
                _series(lost, _GPU, "0 0 0 1 1 1"),
            ],
            _at(2, "GpufleetNodeGpusLost"),
            _at(
                4,
                "GpufleetNodeGpusLost",
                _alert(
                    _NODE_KEYED,
                    "critical",
                    "node",
                    summary="2 GPUs fell off the bus on node-a",
                    description="Several GPUs at once: suspect the baseboard, PCIe switch or "
                    "power.",
                ),
            ),
        ),
    ]


def _gpu_groups() -> list[dict[str, Any]]:
    health = "gpufleet_gpu_health_status"
    xid = "gpufleet_xid_errors_total"
    xid79 = {**_GPU, "xid": "79"}
    xid_alert = _alert(xid79, "warning", "gpu", summary="XID 79 on GPU 3 of node-a")
    return [
        _group(
            [_series(health, _GPU, "0 2 2 2 0")],
            _at(1, "GpufleetGpuFailed"),
            _at(
                3,
                "GpufleetGpuFailed",
                _alert(
                    _GPU_KEYED,
                    "critical",
                    "gpu",
                    summary="GPU 3 on node-a failed its health checks",
                    description=_HEALTH_HINT,
                ),
            ),
            _at(5, "GpufleetGpuFailed"),
        ),
        _group(
            [_series(health, _GPU, "0 1x14")],
            _at(5, "GpufleetGpuWarning"),
            _at(
                12,
                "GpufleetGpuWarning",
                _alert(_GPU_KEYED, "warning", "gpu", summary="GPU 3 on node-a warns"),
            ),
        ),
        # The first XID of a code on a GPU: its counter series is born at 1, so `increase`
        # alone never sees it (XIDs 79, 48, 94/95 usually happen once); it fires at once, goes
        # on firing while a second one comes, and is quiet once 10 minutes pass without one.
        _group(
            [_series(xid, xid79, "_ _ _ 1 2 2x25")],
            _at(2, "GpufleetXidErrors"),
            _at(3, "GpufleetXidErrors", xid_alert),
            _at(4, "GpufleetXidErrors", xid_alert),
            _at(25, "GpufleetXidErrors"),
        ),
        # a GPU with an old XID (counted before the window): only a new one fires
        _group(
            [_series(xid, xid79, "1x15 2x15")],
            _at(14, "GpufleetXidErrors"),
            _at(17, "GpufleetXidErrors", xid_alert),
            _at(30, "GpufleetXidErrors"),
        ),
        _group(
            [_series("gpufleet_gpu_lost", _GPU, "0 0 1 1 1")],
            _at(1, "GpufleetGpuLost"),
            _at(
                3,
                "GpufleetGpuLost",
                _alert(_GPU_KEYED, "critical", "gpu", summary="GPU 3 fell off the bus on node-a"),
            ),
        ),
        _group(
            [
                _series(
                    "gpufleet_clock_event_reason_active",
                    {**_GPU, "reason": "hw_thermal"},
                    "0 1x10",
                )
            ],
            _at(3, "GpuHotAndThrottled"),
            _at(
                8,
                "GpuHotAndThrottled",
                _alert(
                    {**_GPU, "reason": "hw_thermal"},
                    "warning",
                    "gpu",
                    summary="GPU 3 on node-a: HW thermal slowdown",
                ),
            ),
        ),
        _group(
            [_series("DCGM_FI_DEV_ROW_REMAP_FAILURE", _GPU, "0 0 1 1")],
            _at(1, "GpuRowRemapFailure"),
            _at(
                2,
                "GpuRowRemapFailure",
                _alert(_GPU, "critical", "gpu", summary="GPU 3 on node-a: row remapping failed"),
            ),
        ),
    ]


def rule_tests_doc(rules_file: str = "gpufleet-rules.yml") -> dict[str, Any]:
    """promtool's unit-test file for the rules written to ``rules_file`` (a path relative to
    the test file, as promtool reads it)."""
    return {
        "rule_files": [rules_file],
        "evaluation_interval": "1m",
        "tests": [*_node_groups(), *_gpu_groups()],
    }


def alerts_checked(doc: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """Per alert name: how many evaluations expect it firing, and how many expect silence."""
    out: dict[str, tuple[int, int]] = {}
    for group in doc["tests"]:
        for check in group["alert_rule_test"]:
            fired, quiet = out.get(check["alertname"], (0, 0))
            if check["exp_alerts"]:
                fired += 1
            else:
                quiet += 1
            out[check["alertname"]] = (fired, quiet)
    return out
