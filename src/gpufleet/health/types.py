"""Findings: what a health rule concludes about a GPU or a node, with evidence and an action."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from gpufleet.catalog import XidAction


class Severity(IntEnum):
    """Health severity; the integer is what ``gpufleet_health_status`` exports and what
    ``gpufleet health --exit-code`` returns (3 is unknown)."""

    OK = 0
    WARN = 1
    FAIL = 2
    UNKNOWN = 3

    @property
    def word(self) -> str:
        return self.name.lower()


@dataclass(frozen=True)
class Finding:
    """One conclusion of one rule about one component (a GPU UUID or ``node``)."""

    rule: str  # the rule's registry name, e.g. "ecc_dbe"
    code: str  # stable machine code, e.g. "ECC_DBE_VOLATILE" or "XID_79"
    severity: Severity
    component: str  # GPU UUID, or "node"
    message: str
    action: XidAction = XidAction.NONE
    evidence: dict[str, Any] = field(default_factory=dict)
    sticky: bool = False  # hardware findings stay until an operator acknowledges them
    gpu_index: int | None = None
    first_seen_s: float = 0.0
    last_seen_s: float = 0.0
    # What makes this occurrence distinct (e.g. the DBE count, the XID's event time): after an
    # acknowledgement, the same key with the same occurrence stays quiet; a new one is new.
    occurrence: str = ""

    @property
    def key(self) -> tuple[str, str]:
        """Identity of a finding across evaluations: (code, component)."""
        return (self.code, self.component)
