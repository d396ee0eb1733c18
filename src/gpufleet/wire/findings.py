"""Health findings as the agent reports them, and operators' acknowledgements sent back."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from gpufleet.wire.limits import WIRE_CONFIG, FiniteNumber, GpuIndex

MAX_CODE = 64
MAX_COMPONENT = 96


class WireFinding(BaseModel):
    """A `gpufleet.health.types.Finding` on the wire (severity as its integer)."""

    model_config = WIRE_CONFIG

    rule: str = Field(max_length=128)
    code: str = Field(max_length=MAX_CODE)
    severity: int = Field(ge=0, le=3)
    component: str = Field(max_length=MAX_COMPONENT)
    message: str = Field(max_length=4000)
    action: str = Field("none", max_length=64)
    evidence: dict[str, Any] = Field(default_factory=dict)
    sticky: bool = False
    gpu_index: GpuIndex | None = None
    first_seen_s: FiniteNumber = 0.0
    last_seen_s: FiniteNumber = 0.0


class WireAck(BaseModel):
    """An operator's acknowledgement of a sticky finding (``code`` on ``component``), made on
    the control plane, for the node's agent to apply to its own health tracker."""

    model_config = WIRE_CONFIG

    code: str = Field(min_length=1, max_length=MAX_CODE)
    component: str = Field(min_length=1, max_length=MAX_COMPONENT)
    who: str = Field(min_length=1, max_length=128)  # the operator (an actor name)
    why: str = Field(min_length=1, max_length=1000)
    at_s: float  # when it was acknowledged (control-plane clock)
