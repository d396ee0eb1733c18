"""Maintenance campaigns on the wire (issue 15), additive to schema v1.

- `WireUpdateOrder`: rides on the ``Ack`` (field ``update``) while the campaign waits for a
  node's update: the site's command, its timeout and the order's ``key`` (campaign and node).
  The agent runs each key at most once (it keeps a marker in its state directory).
- `WireUpdateReport`: the agent's answer, ``POST /api/v1/maintenance/reports`` with its agent
  token: exit code (None: timed out or could not start) and the tail of the output.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpufleet.wire.limits import NodeName, NoNul

MAX_UPDATE_COMMAND = 4096
MAX_OUTPUT_TAIL = 4000


class WireUpdateOrder(BaseModel):
    """Run the site's update command once, detached, with a timeout."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    key: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
    command: str = Field(min_length=1, max_length=MAX_UPDATE_COMMAND)
    timeout_s: float = Field(gt=0, le=7 * 86400)


class WireUpdateReport(BaseModel):
    """How an update order ended on the node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: NodeName
    key: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._-]+$")
    exit_code: int | None = None  # None: it timed out or could not be started
    timed_out: bool = False
    output_tail: NoNul = Field("", max_length=MAX_OUTPUT_TAIL)
    started_s: float | None = None
    ended_s: float | None = None
