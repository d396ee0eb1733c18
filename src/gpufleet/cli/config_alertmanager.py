"""`gpufleet config alertmanager`: an Alertmanager config for the alerts of
`gpufleet config prometheus --rules`.

Routes by ``severity`` (critical alerts to a pager receiver when one is given) and by ``tenant``
(each tenant's alerts also to that tenant's receiver). Inhibition keeps the most specific alert
and holds back the generic one, never the other way (issue 29): a GPU's own finding alerts
(lost, row remap failure, an XID) hold back its verdict alerts (GPU failed / warns); a GPU
alert holds back its node's verdict alerts (node failed / warns); the node-wide causes (agent
down, several GPUs lost) hold back the node's GPU alerts: one page per broken node, not eight.
Field names follow Alertmanager's configuration reference
(https://prometheus.io/docs/alerting/latest/configuration/; ``matchers`` since 0.22).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import typer
import yaml

from gpufleet.cli.common import JsonOption, http_url
from gpufleet.cli.output import emit_json
from gpufleet.errors import ConfigError, UsageError

_TENANT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_DURATION = re.compile(r"^[0-9]+(ms|s|m|h|d|w|y)$")  # Alertmanager's duration syntax

# The labels the routes group by: ``instance`` is the agent (scrape target) and names the node
# in every gpufleet alert (config_prometheus keeps it).
GROUP_BY = ["alertname", "instance", "tenant"]
GPU_EQUAL = ["instance", "gpu"]  # the same GPU of the same node
NODE_EQUAL = ["instance"]


def _names(*alerts: str) -> str:
    return f'alertname=~"{"|".join(alerts)}"'


# Generic alerts: a health verdict, whatever finding made it.
GPU_VERDICTS = ("GpufleetGpuFailed", "GpufleetGpuWarning")
NODE_VERDICTS = ("GpufleetNodeFailed", "GpufleetNodeWarning")
# Specific ones: they name the finding. GpufleetXidErrors is critical for an XID the catalog
# rates fail (then it may stand in for GpufleetGpuFailed), else warning.
GPU_FINDINGS = ("GpufleetGpuLost", "GpuRowRemapFailure", "GpufleetXidErrors")
GPU_WARNINGS = ("GpufleetXidErrors", "GpuHotAndThrottled")
NODE_CAUSES = ("GpufleetAgentDown", "GpufleetNodeGpusLost")

# Every rule's source is more specific than its target, and no target is a source of a rule
# that targets that source: a specific alert is never the one held back. A warning never
# holds back a critical alert (it would move the page from the pager to the ops receiver).
INHIBIT_RULES: list[dict[str, object]] = [
    {
        "source_matchers": [_names(*GPU_FINDINGS), 'severity="critical"'],
        "target_matchers": [_names(*GPU_VERDICTS)],
        "equal": list(GPU_EQUAL),
    },
    {
        "source_matchers": [_names(*GPU_WARNINGS), 'severity="warning"'],
        "target_matchers": ['alertname="GpufleetGpuWarning"'],
        "equal": list(GPU_EQUAL),
    },
    {
        "source_matchers": ['scope="gpu"', 'severity="critical"'],
        "target_matchers": [_names(*NODE_VERDICTS)],
        "equal": list(NODE_EQUAL),
    },
    {
        "source_matchers": ['scope="gpu"'],
        "target_matchers": ['alertname="GpufleetNodeWarning"'],
        "equal": list(NODE_EQUAL),
    },
    {
        "source_matchers": [_names(*NODE_CAUSES)],
        "target_matchers": ['scope="gpu"'],
        "equal": list(NODE_EQUAL),
    },
    {
        "source_matchers": [_names(*NODE_CAUSES)],
        "target_matchers": [_names(*NODE_VERDICTS, "GpufleetNodeHealthUnknown")],
        "equal": list(NODE_EQUAL),
    },
]


def _webhook(name: str, url: str) -> dict[str, object]:
    return {"name": name, "webhook_configs": [{"url": url, "send_resolved": True}]}


def alertmanager_config(
    default_url: str,
    *,
    critical_url: str | None = None,
    tenants: dict[str, str] | None = None,
    group_wait: str = "30s",
    group_interval: str = "5m",
    repeat_interval: str = "4h",
) -> dict[str, object]:
    """The config document: receivers ``ops`` (everything not routed elsewhere),
    ``critical`` (severity critical, when ``critical_url``), ``tenant-NAME`` per tenant."""
    receivers = [_webhook("ops", default_url)]
    routes: list[dict[str, object]] = []
    for name, url in sorted((tenants or {}).items()):
        receivers.append(_webhook(f"tenant-{name}", url))
        # continue: the tenant's copy does not stop the operators' routes below
        routes.append(
            {"receiver": f"tenant-{name}", "matchers": [f'tenant="{name}"'], "continue": True}
        )
    if critical_url:
        receivers.append(_webhook("critical", critical_url))
        routes.append({"receiver": "critical", "matchers": ['severity="critical"']})
    routes.append({"receiver": "ops"})  # what no route above took (tenant copies included)
    return {
        "route": {
            "receiver": "ops",
            "group_by": GROUP_BY,
            "group_wait": group_wait,
            "group_interval": group_interval,
            "repeat_interval": repeat_interval,
            "routes": routes,
        },
        "inhibit_rules": copy.deepcopy(INHIBIT_RULES),
        "receivers": receivers,
    }


def _tenants(values: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not _TENANT.match(name):
            raise UsageError(f"--tenant {value!r}: expected NAME=URL (NAME: letters, digits, _.-)")
        if name in out:
            raise UsageError(f"--tenant {name!r}: given twice")
        out[name] = http_url(url, "--tenant")
    return out


def _duration(value: str, option: str) -> str:
    if not _DURATION.match(value):
        raise UsageError(f"{option} {value!r}: expected a duration like 30s, 5m or 4h")
    return value


def register_config(config_app: typer.Typer) -> None:
    """Attach `gpufleet config alertmanager`."""

    @config_app.command("alertmanager")
    def alertmanager_cmd(
        webhook: str = typer.Option(
            ..., "--webhook", help="Receiver for every alert (webhook URL; operators)."
        ),
        critical_webhook: str | None = typer.Option(
            None, "--critical-webhook", help="Receiver for critical alerts instead (a pager)."
        ),
        tenant: list[str] = typer.Option(
            None, "--tenant", help="NAME=URL: a tenant's alerts also go there (repeat)."
        ),
        group_wait: str = typer.Option("30s", "--group-wait"),
        group_interval: str = typer.Option("5m", "--group-interval"),
        repeat_interval: str = typer.Option("4h", "--repeat-interval"),
        out: Path | None = typer.Option(None, "--out", help="Write the config to this file."),
        json_out: bool = JsonOption,
    ) -> None:
        """Print an Alertmanager config: routes by severity and tenant; the most specific
        alert pages, the generic one of the same GPU or node is held back."""
        doc = alertmanager_config(
            http_url(webhook, "--webhook"),
            critical_url=http_url(critical_webhook, "--critical-webhook")
            if critical_webhook
            else None,
            tenants=_tenants(tenant or []),
            group_wait=_duration(group_wait, "--group-wait"),
            group_interval=_duration(group_interval, "--group-interval"),
            repeat_interval=_duration(repeat_interval, "--repeat-interval"),
        )
        text = yaml.safe_dump(doc, sort_keys=False)
        if out is not None:
            try:
                out.write_text(text, encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"{out}: cannot write: {exc.strerror or exc}") from exc
        if json_out:
            emit_json(doc)
            return
        typer.echo(text, nl=False)
