"""A fleet-wide power order as asked (issue 16): the body of ``POST /api/v1/power/orders``, and
which nodes it selects and may touch for a given token.

Either one ``limit_w`` for the selected nodes' GPUs (``gpus``, default all) with a selector
(``tenant``, ``partition``, ``labels``, ``nodes``: every one given must match; at least one
is required, so no order reaches the whole fleet by accident), or a per-node, per-GPU plan
(``per_node``, what ``power budget --accept`` sends) and no selector. ``partition`` is the node
label ``partition`` (the controller knows no scheduler partitions; label nodes with
``gpufleet nodes``' PATCH ``labels``)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpufleet.errors import UsageError
from gpufleet.wire.power import MAX_POWER_W

# strict: a JSON true is not 1 W (it was accepted and refused later by every GPU)
Watts = Annotated[float, Field(gt=0, le=MAX_POWER_W, strict=True)]
Name = Annotated[str, Field(min_length=1, max_length=253)]
GpuIndex = Annotated[int, Field(ge=0, le=1023)]
MAX_REVERT_S = 90 * 86400.0


class PowerOrderSpec(BaseModel):
    """What to set where, and when policy puts it back."""

    model_config = ConfigDict(extra="forbid")

    limit_w: Watts | None = None
    gpus: list[GpuIndex] | None = Field(None, min_length=1, max_length=1024)
    per_node: dict[Name, dict[str, Watts]] | None = Field(None, min_length=1, max_length=10000)
    tenant: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    partition: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    labels: dict[Annotated[str, Field(max_length=64)], Annotated[str, Field(max_length=256)]] = (
        Field(default_factory=dict, max_length=32)
    )
    nodes: list[Name] | None = Field(None, min_length=1, max_length=10000)
    revert_after_s: float | None = Field(None, gt=0, le=MAX_REVERT_S)
    dry_run: bool = False
    reason: str = Field("", max_length=500)

    @model_validator(mode="after")
    def _one_form(self) -> PowerOrderSpec:
        if self.per_node is not None:
            if self.limit_w is not None or self.gpus is not None or self.has_selector:
                raise ValueError("per_node is a whole plan: give no limit_w, gpus or selector")
            for node, plan in self.per_node.items():
                for g in plan:
                    if g != "*" and not (g.isdigit() and int(g) <= 1023):
                        raise ValueError(f"per_node.{node}: {g!r} is not a GPU index or '*'")
            return self
        if self.limit_w is None:
            raise ValueError("give limit_w (watts) or per_node")
        if not self.has_selector:
            raise ValueError("give a selector: tenant, partition, labels or nodes")
        return self

    @property
    def has_selector(self) -> bool:
        return bool(self.tenant or self.partition or self.labels or self.nodes)

    def limits_for(self, node: str) -> dict[str, float]:
        """The node's plan: GPU index (string) or ``"*"`` to watts."""
        if self.per_node is not None:
            return dict(self.per_node[node])
        assert self.limit_w is not None
        if self.gpus is None:
            return {"*": self.limit_w}
        return {str(g): self.limit_w for g in sorted(set(self.gpus))}


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
