"""`gpufleet config prometheus`: a scrape config for the node agents and example alert rules."""

from __future__ import annotations

from pathlib import Path

import typer
import yaml

from gpufleet.cli.common import JsonOption, host_port
from gpufleet.cli.output import emit_json
from gpufleet.errors import ConfigError, UsageError

# Alert rules over the agents' metrics. Thresholds: XID codes and actions come from the catalog
# at runtime on the agent; these rules alert on the agent's verdicts and a few raw signals.
# Every alert carries ``scope`` (node or gpu) and keeps the scrape's ``instance``: the
# Alertmanager config (`gpufleet config alertmanager`) inhibits a node's GPU alerts while a
# critical node alert fires for the same instance, and routes by ``severity`` and ``tenant``
# (a target label, see docs/alerts.md).
GPU_KEY = "instance, Hostname, gpu, UUID"
NODE_KEY = "instance, Hostname"
# How long GpufleetGpuLost keeps firing once its series is gone: an agent restart (or a scrape
# that failed) leaves a gap, and the restarted agent exports the lost GPU again under the same
# labels (`gpufleet.telemetry.exposition.IdentityMemory`), so the alert never resolves between.
# ``keep_firing_for`` exists since Prometheus 2.42 (prometheus.io/docs/prometheus/latest/
# configuration/alerting_rules/).
LOST_KEEP_FIRING = "10m"

GPU_RULES: list[dict[str, object]] = [
    {
        "alert": "GpufleetGpuFailed",
        "expr": f"max by ({GPU_KEY}) (gpufleet_gpu_health_status) == 2",
        "for": "1m",
        "labels": {"severity": "critical", "scope": "gpu"},
        "annotations": {
            "summary": "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} failed its health checks",
            "description": "curl http://{{ $labels.instance }}/health for the findings.",
        },
    },
    {
        "alert": "GpufleetGpuWarning",
        "expr": f"max by ({GPU_KEY}) (gpufleet_gpu_health_status) == 1",
        "for": "10m",
        "labels": {"severity": "warning", "scope": "gpu"},
        "annotations": {"summary": "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} warns"},
    },
    {
        "alert": "GpufleetXidErrors",
        "expr": "increase(gpufleet_xid_errors_total[10m]) > 0",
        "labels": {"severity": "warning", "scope": "gpu"},
        "annotations": {
            "summary": "XID {{ $labels.xid }} on GPU {{ $labels.gpu }} of {{ $labels.Hostname }}"
        },
    },
    {
        "alert": "GpufleetGpuLost",
        "expr": f"max by ({GPU_KEY}) (gpufleet_gpu_lost) == 1",
        "keep_firing_for": LOST_KEEP_FIRING,
        "labels": {"severity": "critical", "scope": "gpu"},
        "annotations": {
            "summary": "GPU {{ $labels.gpu }} fell off the bus on {{ $labels.Hostname }}"
        },
    },
    {
        "alert": "GpuHotAndThrottled",
        "expr": 'gpufleet_clock_event_reason_active{reason="hw_thermal"} == 1',
        "for": "5m",
        "labels": {"severity": "warning", "scope": "gpu"},
        "annotations": {
            "summary": "GPU {{ $labels.gpu }} on {{ $labels.Hostname }}: HW thermal slowdown"
        },
    },
    {
        "alert": "GpuRowRemapFailure",
        "expr": "DCGM_FI_DEV_ROW_REMAP_FAILURE == 1",
        "labels": {"severity": "critical", "scope": "gpu"},
        "annotations": {
            "summary": "GPU {{ $labels.gpu }} on {{ $labels.Hostname }}: row remapping failed"
        },
    },
]

NODE_RULES: list[dict[str, object]] = [
    {
        "alert": "GpufleetAgentDown",
        "expr": 'up{job="gpufleet-agent"} == 0',
        "for": "2m",
        "labels": {"severity": "critical", "scope": "node"},
        "annotations": {"summary": "gpufleet agent {{ $labels.instance }} is not answering"},
    },
    {
        "alert": "GpufleetNodeFailed",
        "expr": f"max by ({NODE_KEY}) (gpufleet_node_health_status) == 2",
        "for": "1m",
        "labels": {"severity": "critical", "scope": "node"},
        "annotations": {
            "summary": "node {{ $labels.Hostname }} failed its health checks",
            "description": "Its GPU alerts are held back while this fires; curl "
            "http://{{ $labels.instance }}/health for the findings of every GPU.",
        },
    },
    {
        "alert": "GpufleetNodeWarning",
        "expr": f"max by ({NODE_KEY}) (gpufleet_node_health_status) == 1",
        "for": "10m",
        "labels": {"severity": "warning", "scope": "node"},
        "annotations": {"summary": "node {{ $labels.Hostname }} warns"},
    },
    {
        "alert": "GpufleetNodeHealthUnknown",
        "expr": f"max by ({NODE_KEY}) (gpufleet_node_health_status) == 3",
        "for": "10m",
        "labels": {"severity": "warning", "scope": "node"},
        "annotations": {
            "summary": "node {{ $labels.Hostname }}: the agent cannot judge its health",
            "description": "The agent runs but has no verdict (NVML calls hang or fail).",
        },
    },
    {
        "alert": "GpufleetNodeGpusLost",
        "expr": f"sum by ({NODE_KEY}) (gpufleet_gpu_lost) >= 2",
        "keep_firing_for": LOST_KEEP_FIRING,
        "labels": {"severity": "critical", "scope": "node"},
        "annotations": {
            "summary": "{{ $value }} GPUs fell off the bus on {{ $labels.Hostname }}",
            "description": "Several GPUs at once: suspect the baseboard, PCIe switch or power.",
        },
    },
]

ALERT_RULES: list[dict[str, object]] = [*NODE_RULES, *GPU_RULES]


def scrape_config(
    targets: list[str], interval_s: int = 15, rules_file: str | None = "gpufleet-rules.yml"
) -> dict[str, object]:
    doc: dict[str, object] = {
        "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
        "scrape_configs": [
            {
                "job_name": "gpufleet-agent",
                "scrape_interval": f"{interval_s}s",
                "metrics_path": "/metrics",
                "static_configs": [{"targets": targets}],
            }
        ],
    }
    if rules_file:
        doc["rule_files"] = [rules_file]
    return doc


def rules_doc() -> dict[str, object]:
    """The alert rules file: node rules and GPU rules, one group each."""
    return {
        "groups": [
            {"name": "gpufleet-node", "rules": NODE_RULES},
            {"name": "gpufleet-gpu", "rules": GPU_RULES},
        ]
    }


def register_config(config_app: typer.Typer) -> None:
    """Attach `gpufleet config prometheus`."""

    @config_app.command("prometheus")
    def prometheus_cmd(
        target: list[str] = typer.Option(
            None, "--target", help="Agent HOST:PORT (repeat); default localhost:9400."
        ),
        interval: int = typer.Option(15, "--interval", help="Scrape interval, seconds."),
        rules_out: Path | None = typer.Option(
            None, "--rules-out", help="Also write the alert rules to this file."
        ),
        rules_only: bool = typer.Option(False, "--rules", help="Print the alert rules instead."),
        json_out: bool = JsonOption,
    ) -> None:
        """Print a Prometheus scrape config for the agents (and example alert rules)."""
        if interval < 1:
            raise UsageError("--interval must be at least 1 second")
        targets = [host_port(t, "--target") for t in target or ["localhost:9400"]]
        rules_name = rules_out.name if rules_out else "gpufleet-rules.yml"
        config = scrape_config(targets, interval, rules_name)
        if rules_out is not None:
            try:
                rules_out.write_text(yaml.safe_dump(rules_doc(), sort_keys=False), encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"{rules_out}: cannot write: {exc.strerror or exc}") from exc
        if json_out:
            emit_json({"config": config, "rules": rules_doc()})
            return
        doc = rules_doc() if rules_only else config
        typer.echo(yaml.safe_dump(doc, sort_keys=False), nl=False)
