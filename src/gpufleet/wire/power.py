"""Fleet-wide power limits on the wire (issue 16), additive to schema v1.

- `WirePowerOrder`: rides on the ``Ack`` (list ``power``) while a power order waits for a
  node's answer: set limits (``apply``) or put back the limits recorded before gpufleet changed
  them (``restore``). ``limits`` maps GPU indexes (as strings) or ``"*"`` (every GPU) to watts.
  ``key`` names the order, the node and the action; the agent acts on each key at most once
  (a marker in its state directory), so an order sent again after a controller restart is
  answered with the first result, never applied twice.
- `WirePowerReport`: the agent's answer, ``POST /api/v1/power/reports`` with its agent token:
  one row per GPU, with NVML's error where a GPU refused (no permission, out of range).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.wire.limits import NodeName, NoNul

KEY_PATTERN = r"^[A-Za-z0-9._-]+$"
MAX_POWER_W = 5000.0  # far above any GPU's limit; NVML checks the real range on the node


class WirePowerOrder(BaseModel):
    """Set (or restore) power limits on one node's GPUs, once per key."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    key: str = Field(min_length=1, max_length=128, pattern=KEY_PATTERN)
    action: Literal["apply", "restore"]
    # GPU index (a string) or "*" -> watts; for restore, the GPUs to put back (watts ignored)
    limits: dict[str, float] = Field(default_factory=dict, max_length=1024)


class WireGpuPower(BaseModel):
    """What happened to one GPU: its limit before and after, or why it was not changed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: int = Field(ge=0, le=1023)
    from_w: float | None = Field(None, ge=0, le=MAX_POWER_W)
    to_w: float | None = Field(None, ge=0, le=MAX_POWER_W)
    ok: bool
    error: NoNul | None = Field(None, max_length=500)


class WirePowerReport(BaseModel):
    """How a power order ended on the node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: NodeName
    key: str = Field(min_length=1, max_length=128, pattern=KEY_PATTERN)
    gpus: list[WireGpuPower] = Field(default_factory=list, max_length=1024)
    error: NoNul | None = Field(None, max_length=500)  # the whole order failed (no NVML...)
    done_s: float | None = None
