"""A fleet-wide power order as asked (issue 16): which nodes the body of ``POST
/api/v1/power/orders`` (`gpufleet.wire.views.PowerOrderSpec`) selects and may touch.

``partition`` is the node label ``partition`` (the controller knows no scheduler partitions;
label nodes with ``gpufleet nodes``' PATCH ``labels``)."""

from __future__ import annotations

from typing import Any

from gpufleet.errors import UsageError
from gpufleet.wire.views import MAX_REVERT_S, PowerOrderSpec

__all__ = ["MAX_REVERT_S", "PowerOrderSpec", "matches", "named_nodes", "parse_duration"]


def matches(spec: PowerOrderSpec, name: str, tenant: str | None, labels: dict[str, Any]) -> bool:
    """Whether a node is selected (every selector given must match)."""
    if spec.per_node is not None:
        return name in spec.per_node
    if spec.tenant is not None and tenant != spec.tenant:
        return False
    if spec.partition is not None and str(labels.get("partition")) != spec.partition:
        return False
    if any(str(labels.get(k)) != v for k, v in spec.labels.items()):
        return False
    return spec.nodes is None or name in spec.nodes


def named_nodes(spec: PowerOrderSpec) -> list[str]:
    """Nodes the spec names outright (``nodes`` or ``per_node``)."""
    if spec.per_node is not None:
        return sorted(spec.per_node)
    return sorted(spec.nodes or [])


def parse_duration(text: str, field: str = "--revert-after") -> float:
    """``90s``, ``30m``, ``8h``, ``2d`` (or plain seconds) to seconds."""
    t = text.strip().lower()
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    scale = units.get(t[-1:])
    number = t[:-1] if scale is not None else t
    try:
        value = float(number) * (scale or 1.0)
    except ValueError:
        value = -1.0
    if not 0 < value <= MAX_REVERT_S:
        raise UsageError(f"{field} {text!r}: expected a duration like 90s, 30m, 8h or 2d (<= 90d)")
    return value
