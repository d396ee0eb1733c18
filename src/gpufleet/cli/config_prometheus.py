"""`gpufleet config prometheus`: a scrape config for the node agents (static targets, or
discovered from the controller's node list by HTTP or file service discovery) and example
alert rules."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import typer
import yaml

from gpufleet.cli import alert_texts as T
from gpufleet.cli.common import JsonOption, TokenFileOption, host_port, http_url, read_token
from gpufleet.cli.output import emit_json, err_console
from gpufleet.control.fleet.prometheus_sd import DEFAULT_AGENT_PORT, META
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
# A new XID in the last 10 minutes. The agent's counter series of an XID code on a GPU is born
# at its first event with the value 1, so ``increase`` alone never sees that first one (and
# XIDs 79, 48, 94/95 usually come once): a series that did not exist 10 minutes ago is new too.
# A Prometheus that starts scraping an agent with XIDs already counted alerts on them once.
XID_NEW = (
    "increase(gpufleet_xid_errors_total[10m]) > 0"
    " or (gpufleet_xid_errors_total unless gpufleet_xid_errors_total offset 10m)"
)

GPU_RULES: list[dict[str, object]] = [
    {
        "alert": "GpufleetGpuFailed",
        "expr": f"max by ({GPU_KEY}) (gpufleet_gpu_health_status) == 2",
        "for": "1m",
        "labels": {"severity": "critical", "scope": "gpu"},
        "annotations": {
            "summary": f"{T.GPU} on {T.NODE} failed its health checks",
            "description": f"{T.GPU_FULL}: the agent's health verdict is fail for 1 minute "
            f"(gpufleet_gpu_health_status 2).{T.GPU_EVIDENCE} Every finding with its code "
            f"and evidence: curl {T.HEALTH_URL}",
        },
    },
    {
        "alert": "GpufleetGpuWarning",
        "expr": f"max by ({GPU_KEY}) (gpufleet_gpu_health_status) == 1",
        "for": "10m",
        "labels": {"severity": "warning", "scope": "gpu"},
        "annotations": {
            "summary": f"{T.GPU} on {T.NODE} warns: health verdict warn for 10 minutes",
            "description": f"{T.GPU_FULL}: the agent's health verdict is warn for 10 minutes "
            f"(gpufleet_gpu_health_status 1).{T.GPU_EVIDENCE} Every finding with its code "
            f"and evidence: curl {T.HEALTH_URL}",
        },
    },
    {
        "alert": "GpufleetXidErrors",
        "expr": XID_NEW,
        # critical for a code the XID catalog rates fail: it holds back GpufleetGpuFailed of
        # the GPU (config_alertmanager), so it must page as loudly
        "labels": {"severity": T.xid_severity_label(), "scope": "gpu"},
        "annotations": {
            "summary": "XID {{ $labels.xid }} on GPU {{ $labels.gpu }} of "
            f"{T.NODE}: {T.xid_name()}",
            "description": f"{T.GPU_FULL} logged XID {{{{ $labels.xid }}}} in the last 10 "
            "minutes (finding XID_{{ $labels.xid }}): "
            f"{T.xid_meaning()}{T.xid_count()}. curl {T.HEALTH_URL} for its findings.",
        },
    },
    {
        "alert": "GpufleetGpuLost",
        "expr": f"max by ({GPU_KEY}) (gpufleet_gpu_lost) == 1",
        "keep_firing_for": LOST_KEEP_FIRING,
        "labels": {"severity": "critical", "scope": "gpu"},
        "annotations": {
            "summary": f"{T.GPU} on {T.NODE} fell off the bus (GPU_LOST)",
            "description": f"{T.GPU_FULL} answers every NVML call with GPU is lost "
            "(gpufleet_gpu_lost 1, finding GPU_LOST"
            '{{ with printf `gpufleet_xid_errors_total{instance=%q,gpu=%q,xid="79"}` '
            "$labels.instance $labels.gpu | query }}, XID 79 logged{{ end }}): reboot the "
            "node; a GPU still lost after the reboot needs the node drained and inspected "
            "(seating, baseboard, power). Keeps firing for "
            f"{LOST_KEEP_FIRING} through agent restarts.",
        },
    },
    {
        "alert": "GpuHotAndThrottled",
        "expr": 'gpufleet_clock_event_reason_active{reason="hw_thermal"} == 1',
        "for": "5m",
        "labels": {"severity": "warning", "scope": "gpu"},
        "annotations": {
            "summary": f"{T.GPU} on {T.NODE}: HW thermal slowdown for 5 minutes "
            "(HW_THERMAL_SLOWDOWN)",
            "description": f"{T.GPU_FULL} has had the clock-event reason hw_thermal active "
            "for 5 minutes (finding HW_THERMAL_SLOWDOWN"
            "{{ with printf `DCGM_FI_DEV_GPU_TEMP{instance=%q,gpu=%q}` $labels.instance "
            "$labels.gpu | query }}, at {{ . | first | value | humanize }} C{{ end }}): the "
            "GPU lowers its clocks to cool down; check the cooling and airflow.",
        },
    },
    {
        "alert": "GpuRowRemapFailure",
        "expr": "DCGM_FI_DEV_ROW_REMAP_FAILURE == 1",
        "labels": {"severity": "critical", "scope": "gpu"},
        "annotations": {
            "summary": f"{T.GPU} on {T.NODE}: row remapping failed (ROW_REMAP_FAILURE)",
            "description": f"{T.GPU_FULL} has a memory bank with no spare rows left "
            "(DCGM_FI_DEV_ROW_REMAP_FAILURE 1, finding ROW_REMAP_FAILURE, XID 64): its "
            "memory cannot be repaired in the field; drain the node and inspect or replace "
            "the GPU.",
        },
    },
]

NODE_ITSELF = "no GPU (a finding of the node itself)"
_NODE_GPUS_AT = "gpufleet_gpu_health_status{{instance=%q}} == {}"

NODE_RULES: list[dict[str, object]] = [
    {
        "alert": "GpufleetAgentDown",
        "expr": 'up{job="gpufleet-agent"} == 0',
        "for": "2m",
        "labels": {"severity": "critical", "scope": "node"},
        # `up` carries the scrape's labels only: the agent's address names the node
        "annotations": {
            "summary": "gpufleet agent {{ $labels.instance }} is not answering",
            "description": "Prometheus has failed to scrape http://{{ $labels.instance }}"
            "/metrics for 2 minutes (up 0): the agent, its host or the network is down. The "
            "node's GPU alerts are held back while this fires.",
        },
    },
    {
        "alert": "GpufleetNodeFailed",
        "expr": f"max by ({NODE_KEY}) (gpufleet_node_health_status) == 2",
        "for": "1m",
        "labels": {"severity": "critical", "scope": "node"},
        "annotations": {
            "summary": f"node {T.NODE} failed its health checks",
            "description": f"Node {T.NODE}: the agent's health verdict is fail for 1 minute "
            "(gpufleet_node_health_status 2); failing:"
            f"{T.node_gpus(_NODE_GPUS_AT.format(2), NODE_ITSELF)}. Held back while a critical "
            "alert of one of its GPUs fires: that one names the finding. Every finding: curl "
            f"{T.HEALTH_URL}",
        },
    },
    {
        "alert": "GpufleetNodeWarning",
        "expr": f"max by ({NODE_KEY}) (gpufleet_node_health_status) == 1",
        "for": "10m",
        "labels": {"severity": "warning", "scope": "node"},
        "annotations": {
            "summary": f"node {T.NODE} warns: health verdict warn for 10 minutes",
            "description": f"Node {T.NODE}: the agent's health verdict is warn for 10 minutes "
            "(gpufleet_node_health_status 1); warning:"
            f"{T.node_gpus(_NODE_GPUS_AT.format(1), NODE_ITSELF)}. Held back while an alert of "
            "one of its GPUs fires: that one names the finding. Every finding: curl "
            f"{T.HEALTH_URL}",
        },
    },
    {
        "alert": "GpufleetNodeHealthUnknown",
        "expr": f"max by ({NODE_KEY}) (gpufleet_node_health_status) == 3",
        "for": "10m",
        "labels": {"severity": "warning", "scope": "node"},
        "annotations": {
            "summary": f"node {T.NODE}: the agent cannot judge its health",
            "description": f"The agent on {T.NODE} runs but has had no health verdict for 10 "
            "minutes (gpufleet_node_health_status 3): NVML calls hang or fail. curl "
            f"{T.HEALTH_URL}",
        },
    },
    {
        "alert": "GpufleetNodeGpusLost",
        "expr": f"sum by ({NODE_KEY}) (gpufleet_gpu_lost) >= 2",
        "keep_firing_for": LOST_KEEP_FIRING,
        "labels": {"severity": "critical", "scope": "node"},
        "annotations": {
            "summary": f"{{{{ $value | humanize }}}} GPUs fell off the bus on {T.NODE} (GPU_LOST)",
            "description": "Lost:"
            f"{T.node_gpus('gpufleet_gpu_lost{instance=%q} == 1', 'none')} on {T.NODE} (finding "
            "GPU_LOST on each: NVML answers GPU is lost). Several at once: suspect the "
            "baseboard, PCIe switch or power. Their GPU alerts are held back while this fires.",
        },
    },
]

ALERT_RULES: list[dict[str, object]] = [*NODE_RULES, *GPU_RULES]


def scrape_config(
    targets: list[str],
    interval_s: int = 15,
    rules_file: str | None = "gpufleet-rules.yml",
    *,
    discovery: dict[str, object] | None = None,
) -> dict[str, object]:
    """The Prometheus config; ``discovery`` (`http_sd`, `file_sd`) replaces the static
    ``targets``."""
    job: dict[str, object] = {
        "job_name": "gpufleet-agent",
        "scrape_interval": f"{interval_s}s",
        "metrics_path": "/metrics",
    }
    job.update(discovery or {"static_configs": [{"targets": targets}]})
    if discovery:
        job["relabel_configs"] = SD_RELABEL
    doc: dict[str, object] = {
        "global": {"scrape_interval": f"{interval_s}s", "evaluation_interval": f"{interval_s}s"},
        "scrape_configs": [job],
    }
    if rules_file:
        doc["rule_files"] = [rules_file]
    return doc


# Discovered targets: keep the controller's rack and tenant as labels of every series.
SD_RELABEL: list[dict[str, object]] = [
    {"source_labels": [f"{META}rack"], "target_label": "rack"},
    {"source_labels": [f"{META}tenant"], "target_label": "tenant"},
]


def http_sd(
    controller: str, token_file: str, refresh_s: int, port: int = DEFAULT_AGENT_PORT
) -> dict[str, object]:
    """``http_sd_configs`` reading the controller's ``/api/v1/prometheus/sd`` with a viewer
    token that Prometheus reads from ``token_file`` (https://prometheus.io/docs/prometheus/
    latest/configuration/configuration/#http_sd_config)."""
    url = controller.rstrip("/") + "/api/v1/prometheus/sd"
    if port != DEFAULT_AGENT_PORT:
        url += f"?port={port}"
    cfg = {
        "url": url,
        "refresh_interval": f"{refresh_s}s",
        "authorization": {"type": "Bearer", "credentials_file": token_file},
    }
    return {"http_sd_configs": [cfg]}


def file_sd(path: str, refresh_s: int) -> dict[str, object]:
    """``file_sd_configs`` reading a target file (Prometheus also watches it for changes)."""
    return {"file_sd_configs": [{"files": [path], "refresh_interval": f"{refresh_s}s"}]}


def write_sd_file(path: Path, groups: list[dict[str, object]]) -> None:
    """Write the target groups atomically (Prometheus may read the file at any moment)."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(groups, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write: {exc.strerror or exc}") from exc


def rules_doc() -> dict[str, object]:
    """The alert rules file: node rules and GPU rules, one group each (a copy: the caller
    may change it)."""
    return copy.deepcopy(
        {
            "groups": [
                {"name": "gpufleet-node", "rules": NODE_RULES},
                {"name": "gpufleet-gpu", "rules": GPU_RULES},
            ]
        }
    )


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
        rules_tests_out: Path | None = typer.Option(
            None,
            "--rules-tests-out",
            help="With --rules-out: also write promtool unit tests of the rules to this file "
            "(promtool test rules FILE).",
        ),
        rules_only: bool = typer.Option(False, "--rules", help="Print the alert rules instead."),
        controller: str | None = typer.Option(
            None,
            "--controller",
            help="Discover the agents from this controller's node list (instead of --target).",
        ),
        sd: str = typer.Option(
            "http",
            "--sd",
            help="With --controller: http (Prometheus asks the controller) or file (write "
            "--sd-file now from the controller's node list).",
        ),
        sd_file: Path | None = typer.Option(
            None, "--sd-file", help="--sd file: the target file to write.", metavar="FILE"
        ),
        sd_token_file: str = typer.Option(
            "/etc/prometheus/gpufleet-token",
            "--sd-token-file",
            help="--sd http: where Prometheus reads a viewer token from.",
        ),
        sd_refresh: int = typer.Option(60, "--sd-refresh", help="Re-discovery, seconds."),
        agent_port: int = typer.Option(
            DEFAULT_AGENT_PORT, "--agent-port", help="The agents' /metrics port."
        ),
        token: str | None = typer.Option(
            None, "--token", envvar="GPUFLEET_TOKEN", help="--sd file: token to read nodes."
        ),
        token_file: Path | None = TokenFileOption,
        json_out: bool = JsonOption,
    ) -> None:
        """Print a Prometheus scrape config for the agents (and example alert rules)."""
        if interval < 1:
            raise UsageError("--interval must be at least 1 second")
        if sd_refresh < 1:
            raise UsageError("--sd-refresh must be at least 1 second")
        if not 1 <= agent_port <= 65535:
            raise UsageError(f"--agent-port {agent_port}: expected 1-65535")
        if rules_tests_out is not None and rules_out is None:
            raise UsageError("--rules-tests-out needs --rules-out FILE (the rules it tests)")
        targets = [host_port(t, "--target") for t in target or ["localhost:9400"]]
        rules_name = rules_out.name if rules_out else "gpufleet-rules.yml"
        discovery = None
        if controller is not None:
            if target:
                raise UsageError("give --target or --controller, not both")
            http_url(controller, "--controller")
            if sd == "http":
                discovery = http_sd(controller, sd_token_file, sd_refresh, agent_port)
            elif sd == "file":
                if sd_file is None:
                    raise UsageError("--sd file needs --sd-file FILE")
                discovery = file_sd(str(sd_file.resolve()), sd_refresh)
                groups = _fetch_targets(controller, read_token(token, token_file), agent_port)
                write_sd_file(sd_file, groups)
                err_console.print(f"wrote {len(groups)} target group(s) to {sd_file}")
            else:
                raise UsageError(f"--sd {sd!r}: use http or file")
        config = scrape_config(targets, interval, rules_name, discovery=discovery)
        if rules_out is not None:
            try:
                rules_out.write_text(yaml.safe_dump(rules_doc(), sort_keys=False), encoding="utf-8")
            except OSError as exc:
                raise ConfigError(f"{rules_out}: cannot write: {exc.strerror or exc}") from exc
        if rules_tests_out is not None and rules_out is not None:
            _write_rule_tests(rules_tests_out, rules_out)
        if json_out:
            emit_json({"config": config, "rules": rules_doc()})
            return
        doc = rules_doc() if rules_only else config
        typer.echo(yaml.safe_dump(doc, sort_keys=False), nl=False)


def _write_rule_tests(path: Path, rules: Path) -> None:
    """promtool's unit tests of the rules in ``rules`` (named relative to ``path``, as
    promtool resolves it)."""
    from gpufleet.cli.prometheus_rule_tests import rule_tests_doc

    rel = os.path.relpath(rules.resolve(), path.resolve().parent)
    try:
        path.write_text(yaml.safe_dump(rule_tests_doc(rel), sort_keys=False), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot write: {exc.strerror or exc}") from exc
    err_console.print(f"wrote the rules' unit tests to {path}: promtool test rules {path}")


def _fetch_targets(controller: str, token: str | None, port: int) -> list[dict[str, object]]:
    """The controller's HTTP SD answer (the same groups Prometheus would fetch)."""
    from gpufleet.client import Client

    if not token:
        raise UsageError("--sd file needs --token-file (or GPUFLEET_TOKEN_FILE, --token)")
    with Client(controller, token, timeout_s=30.0) as client:
        groups = client.request("GET", "/prometheus/sd", params={"port": port})
    if not isinstance(groups, list):
        raise ConfigError(f"{controller}: /api/v1/prometheus/sd answered no list")
    return groups
