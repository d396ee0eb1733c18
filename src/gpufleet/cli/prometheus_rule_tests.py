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
CLOCK = "gpufleet_clock_event_reason_active"
_GPU_KEYED = {"instance": INSTANCE, "Hostname": HOST, "gpu": "3", "UUID": UUID}
_NODE_KEYED = {"instance": INSTANCE, "Hostname": HOST}
HEALTH = f"http://{INSTANCE}/health"


def gpu_full(gpu: str = "3", uuid: str | None = UUID, host: str = HOST) -> str:
    """How a description names a GPU: "GPU 3 (GPU-8c1f...) on node-a"."""
    return f"GPU {gpu}{f' ({uuid})' if uuid else ''} on {host}"


def gpu_failed_text(gpu: str = "3", evidence: str = "", **kw: Any) -> dict[str, str]:
    """GpufleetGpuFailed's annotations; ``evidence``: the finding codes the series show."""
    return {
        "summary": f"GPU {gpu} on {kw.get('host', HOST)} failed its health checks",
        "description": f"{gpu_full(gpu, **kw)}: the agent's health verdict is fail for 1 minute "
        f"(gpufleet_gpu_health_status 2).{evidence} Every finding with its code and evidence: "
        f"curl {HEALTH}",
    }


def gpu_lost_text(
    gpu: str = "3", *, xid79: bool = False, uuid: str | None = UUID, host: str = HOST
) -> dict[str, str]:
    """GpufleetGpuLost's annotations (``xid79``: the agent counted an XID 79 on the GPU)."""
    return {
        "summary": f"GPU {gpu} on {host} fell off the bus (GPU_LOST)",
        "description": f"{gpu_full(gpu, uuid, host)} answers every NVML call with GPU is lost "
        f"(gpufleet_gpu_lost 1, finding GPU_LOST{', XID 79 logged' if xid79 else ''}): reboot "
        "the node; a GPU still lost after the reboot needs the node drained and inspected "
        "(seating, baseboard, power). Keeps firing for 10m through agent restarts.",
    }


def xid_text(code: int, count: int, gpu: str = "3") -> dict[str, str]:
    """GpufleetXidErrors' annotations, the words from the XID catalog."""
    from gpufleet.catalog import load_catalog
    from gpufleet.cli.alert_texts import ACTION_WORDS

    entry = load_catalog().xid(code)
    name = entry.name if entry else "not in gpufleet's XID catalog"
    meaning = (
        f"{entry.name} ({entry.severity.value}; {ACTION_WORDS[entry.action]})"
        if entry
        else "a code not in gpufleet's XID catalog (warn)"
    )
    return {
        "summary": f"XID {code} on GPU {gpu} of {HOST}: {name}",
        "description": f"{gpu_full(gpu)} logged XID {code} in the last 10 minutes (finding "
        f"XID_{code}): {meaning}; the agent counted {count} of them. curl {HEALTH} for its "
        "findings.",
    }


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
    health = "gpufleet_gpu_health_status"

    def node_text(verdict: str, value: int, for_: str, gpus: str) -> dict[str, str]:
        word = "failing" if verdict == "fail" else "warning"
        held = "a critical alert" if verdict == "fail" else "an alert"
        return {
            "description": f"Node {HOST}: the agent's health verdict is {verdict} for {for_} "
            f"(gpufleet_node_health_status {value}); {word}: {gpus}. Held back while {held} "
            f"of one of its GPUs fires: that one names the finding. Every finding: curl "
            f"{HEALTH}",
        }

    failed = _alert(
        _NODE_KEYED,
        "critical",
        "node",
        summary="node node-a failed its health checks",
        **node_text("fail", 2, "1 minute", "GPU 3"),
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
                    description=f"Prometheus has failed to scrape http://{INSTANCE}/metrics for "
                    "2 minutes (up 0): the agent, its host or the network is down. The node's "
                    "GPU alerts are held back while this fires.",
                ),
            ),
            _at(8, "GpufleetAgentDown"),  # back
        ),
        # the node fails because GPU 3 does: the description names the GPU
        _group(
            [
                _series(node, _NODE, "0 0 2 2 2 2 0 0"),
                _series(health, _GPU, "0 0 2 2 2 2 0 0"),
            ],
            _at(1, "GpufleetNodeFailed"),
            _at(4, "GpufleetNodeFailed", failed),
            _at(7, "GpufleetNodeFailed"),
        ),
        # a warning pages only after 10 minutes: a passing blip does not; a warning of the
        # node itself (no GPU warns) says so
        _group(
            [_series(node, _NODE, "1x3 0x3 1x14"), _series(health, _GPU, "0x21")],
            _at(3, "GpufleetNodeWarning"),
            _at(12, "GpufleetNodeWarning"),
            _at(
                18,
                "GpufleetNodeWarning",
                _alert(
                    _NODE_KEYED,
                    "warning",
                    "node",
                    summary="node node-a warns: health verdict warn for 10 minutes",
                    **node_text("warn", 1, "10 minutes", "no GPU (a finding of the node itself)"),
                ),
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
                    description="The agent on node-a runs but has had no health verdict for "
                    "10 minutes (gpufleet_node_health_status 3): NVML calls hang or fail. curl "
                    f"{HEALTH}",
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
                    summary="2 GPUs fell off the bus on node-a (GPU_LOST)",
                    description="Lost: GPU 0 GPU 3 on node-a (finding GPU_LOST on each: NVML "
                    "answers GPU is lost). Several at once: suspect the baseboard, PCIe switch "
                    "or power. Their GPU alerts are held back while this fires.",
                ),
            ),
        ),
    ]


def _gpu_groups() -> list[dict[str, Any]]:
    health = "gpufleet_gpu_health_status"
    xid = "gpufleet_xid_errors_total"
    lost = "gpufleet_gpu_lost"
    xid79 = {**_GPU, "xid": "79"}
    gpu0 = {**_GPU, "gpu": "0", "device": "nvidia0", "UUID": UUID.replace("8c1f", "0a0a")}

    def xid_alert(code: int, count: int, severity: str) -> Any:
        return _alert({**_GPU, "xid": str(code)}, severity, "gpu", **xid_text(code, count))

    thermal = {**_GPU, "reason": "hw_thermal"}
    return [
        # GPU 3 fails with an XID 48 counted, GPU 0 fails because it fell off the bus: each
        # description names the codes its GPU's series show
        _group(
            [
                _series(health, _GPU, "0 2 2 2 0"),
                _series(xid, {**_GPU, "xid": "48"}, "1x4"),
                _series(lost, _GPU, "0x4"),
                _series(health, gpu0, "0 2 2 2 0"),
                _series(lost, gpu0, "0 1 1 1 0"),
            ],
            _at(1, "GpufleetGpuFailed"),
            _at(
                3,
                "GpufleetGpuFailed",
                _alert(
                    _GPU_KEYED,
                    "critical",
                    "gpu",
                    **gpu_failed_text(evidence=" XID_48: 1 XID 48 event(s) counted by the agent."),
                ),
                _alert(
                    {**_GPU_KEYED, "gpu": "0", "UUID": gpu0["UUID"]},
                    "critical",
                    "gpu",
                    **gpu_failed_text("0", " GPU_LOST: it fell off the bus.", uuid=gpu0["UUID"]),
                ),
            ),
            _at(5, "GpufleetGpuFailed"),
        ),
        _group(
            [_series(health, _GPU, "0 1x14"), _series(CLOCK, thermal, "0 1x14")],
            _at(5, "GpufleetGpuWarning"),
            _at(
                12,
                "GpufleetGpuWarning",
                _alert(
                    _GPU_KEYED,
                    "warning",
                    "gpu",
                    summary="GPU 3 on node-a warns: health verdict warn for 10 minutes",
                    description=f"{gpu_full()}: the agent's health verdict is warn for 10 "
                    "minutes (gpufleet_gpu_health_status 1). HW_THERMAL_SLOWDOWN: HW thermal "
                    "slowdown active. Every finding with its code and evidence: curl "
                    f"{HEALTH}",
                ),
            ),
        ),
        # The first XID of a code on a GPU: its counter series is born at 1, so `increase`
        # alone never sees it (XIDs 79, 48, 94/95 usually happen once); it fires at once, goes
        # on firing while a second one comes, and is quiet once 10 minutes pass without one.
        # 79 is a fatal code in the XID catalog: critical
        _group(
            [_series(xid, xid79, "_ _ _ 1 2 2x25")],
            _at(2, "GpufleetXidErrors"),
            _at(3, "GpufleetXidErrors", xid_alert(79, 1, "critical")),
            _at(4, "GpufleetXidErrors", xid_alert(79, 2, "critical")),
            _at(25, "GpufleetXidErrors"),
        ),
        # a GPU with an old XID (counted before the window): only a new one fires
        _group(
            [_series(xid, xid79, "1x15 2x15")],
            _at(14, "GpufleetXidErrors"),
            _at(17, "GpufleetXidErrors", xid_alert(79, 2, "critical")),
            _at(30, "GpufleetXidErrors"),
        ),
        # an application XID (13) and a code the catalog does not know warn
        _group(
            [
                _series(xid, {**_GPU, "xid": "13"}, "_ 1x5"),
                _series(xid, {**_GPU, "xid": "999"}, "_ 3x5"),
            ],
            _at(0, "GpufleetXidErrors"),
            _at(
                2,
                "GpufleetXidErrors",
                xid_alert(13, 1, "warning"),
                xid_alert(999, 3, "warning"),
            ),
        ),
        _group(
            [_series(lost, _GPU, "0 0 1 1 1"), _series(xid, xid79, "_ _ 1 1 1")],
            _at(1, "GpufleetGpuLost"),
            _at(
                3,
                "GpufleetGpuLost",
                _alert(_GPU_KEYED, "critical", "gpu", **gpu_lost_text(xid79=True)),
            ),
        ),
        _group(
            [_series(CLOCK, thermal, "0 1x10"), _series("DCGM_FI_DEV_GPU_TEMP", _GPU, "91x10")],
            _at(3, "GpuHotAndThrottled"),
            _at(
                8,
                "GpuHotAndThrottled",
                _alert(
                    thermal,
                    "warning",
                    "gpu",
                    summary="GPU 3 on node-a: HW thermal slowdown for 5 minutes "
                    "(HW_THERMAL_SLOWDOWN)",
                    description=f"{gpu_full()} has had the clock-event reason hw_thermal "
                    "active for 5 minutes (finding HW_THERMAL_SLOWDOWN, at 91 C): the GPU "
                    "lowers its clocks to cool down; check the cooling and airflow.",
                ),
            ),
        ),
        _group(
            [_series("DCGM_FI_DEV_ROW_REMAP_FAILURE", _GPU, "0 0 1 1")],
            _at(1, "GpuRowRemapFailure"),
            _at(
                2,
                "GpuRowRemapFailure",
                _alert(
                    _GPU,
                    "critical",
                    "gpu",
                    summary="GPU 3 on node-a: row remapping failed (ROW_REMAP_FAILURE)",
                    description=f"{gpu_full()} has a memory bank with no spare rows left "
                    "(DCGM_FI_DEV_ROW_REMAP_FAILURE 1, finding ROW_REMAP_FAILURE, XID 64): its "
                    "memory cannot be repaired in the field; drain the node and inspect or "
                    "replace the GPU.",
                ),
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
