"""Prometheus service discovery of the node agents from the controller's node list.

`targets` builds Prometheus' target groups, the one JSON format that both file-based SD
(``file_sd_configs``, https://prometheus.io/docs/guides/file-sd/) and HTTP SD
(``http_sd_configs``, https://prometheus.io/docs/prometheus/latest/http_sd/) read: a list of
``{"targets": ["HOST:PORT"], "labels": {...}}``. Labels starting with ``__meta_`` are for
relabelling only and dropped before storage (the HTTP SD page); the agent's series carry their
own ``Hostname`` label already.

Each node is one group: its agent at ``NODE:PORT`` (``PORT`` 9400 by default, the agent's and
dcgm-exporter's port), or at the address in the node's ``metrics_address`` label
(``PATCH /api/v1/nodes/NAME``, ``Client.set_node(labels=...)``) when its name does not
resolve to the agent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

DEFAULT_AGENT_PORT = 9400
ADDRESS_LABEL = "metrics_address"
META = "__meta_gpufleet_"


@dataclass(frozen=True)
class SdNode:
    """What discovery needs of one node."""

    name: str
    state: str
    rack: str | None
    tenant: str | None
    model: str | None
    labels: Mapping[str, Any]


def _valid_address(value: object) -> bool:
    if not isinstance(value, str):
        return False
    host, sep, port = value.rpartition(":")
    return bool(sep and host and port.isdigit() and 1 <= int(port) <= 65535)


def target_of(node: SdNode, port: int = DEFAULT_AGENT_PORT) -> str:
    """The agent's ``HOST:PORT``: the node's ``metrics_address`` label, else ``NAME:PORT``."""
    addr = node.labels.get(ADDRESS_LABEL)
    if _valid_address(addr):
        return str(addr)
    host = f"[{node.name}]" if ":" in node.name else node.name
    return f"{host}:{port}"


def targets(nodes: Iterable[SdNode], port: int = DEFAULT_AGENT_PORT) -> list[dict[str, Any]]:
    """Target groups, one per node, sorted by name (stable output: Prometheus diffs it)."""
    groups = []
    for n in sorted(nodes, key=lambda x: x.name):
        labels = {f"{META}node": n.name, f"{META}state": n.state}
        for key, value in (("rack", n.rack), ("tenant", n.tenant), ("model", n.model)):
            if value:
                labels[f"{META}{key}"] = value
        groups.append({"targets": [target_of(n, port)], "labels": labels})
    return groups
