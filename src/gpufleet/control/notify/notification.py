"""One notification: what happened, how serious, on which node, as the sinks send it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

SEVERITIES = ("info", "warning", "critical")


@dataclass(frozen=True)
class Notification:
    """One thing to tell people about."""

    id: str
    kind: str
    at_s: float
    summary: str
    severity: int = 0  # 0 info, 1 warning, 2 critical
    node: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at_s)),
            "at_s": self.at_s,
            "severity": SEVERITIES[max(0, min(2, self.severity))],
            "node": self.node,
            "summary": self.summary,
            "data": self.data,
            "source": "gpufleet",
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Notification:
        """The notification `to_json` wrote (the outbox keeps that document)."""
        severity = doc.get("severity")
        level = SEVERITIES.index(severity) if severity in SEVERITIES else 0
        return cls(
            id=str(doc["id"]),
            kind=str(doc["kind"]),
            at_s=float(doc["at_s"]),
            summary=str(doc.get("summary") or ""),
            severity=level,
            node=doc.get("node"),
            data=dict(doc.get("data") or {}),
        )
