"""Remediation policy: which findings drain a node automatically, the circuit breaker that stops
automatic drains when too much of the fleet is already out, and a dry-run mode.

The breaker exists so that a bad rule or a flapping sensor cannot empty the cluster: when more
than ``max_out_fraction`` of the nodes are already out (draining, drained, repair, lost, failed),
automatic drains stop, an event and a log line say so, and the API flags it until it closes.
"""

from __future__ import annotations

import fnmatch
import logging
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpufleet.errors import ConfigError

log = logging.getLogger("gpufleet.control.remediation")


class RemediationPolicy(BaseModel):
    """The policy, loadable from YAML (``--policy FILE``) and editable by admins over the API."""

    model_config = ConfigDict(extra="forbid")

    auto_drain_on_fail: bool = Field(
        True, description="Drain a node when a finding of severity fail appears on it."
    )
    auto_drain: dict[str, bool] = Field(
        default_factory=dict,
        description="Per finding code (glob patterns allowed, e.g. 'XID_*'): drain or not. "
        "The most specific match (longest pattern) wins over auto_drain_on_fail.",
    )
    max_out_fraction: float = Field(
        0.10,
        ge=0.0,
        le=1.0,
        description="Circuit breaker: no automatic drain while more "
        "than this fraction of the fleet is already out.",
    )
    dry_run: bool = Field(False, description="Record what would be done; change nothing.")
    require_validation: bool = Field(
        False,
        description="New or repaired nodes wait in validating for a posted validation "
        "result; when false, a node whose agent reports no fail finding goes in service.",
    )

    def wants_drain(self, code: str, severity: int) -> bool:
        matches = [p for p in self.auto_drain if fnmatch.fnmatchcase(code, p)]
        if matches:
            return self.auto_drain[max(matches, key=len)]
        return self.auto_drain_on_fail and severity >= 2


def load_policy(path: Path | None) -> RemediationPolicy:
    if path is None:
        return RemediationPolicy()
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        return RemediationPolicy.model_validate(data)
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML: {exc}") from exc
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"{path}: {where}: {err['msg']}") from exc


@dataclass(frozen=True)
class Decision:
    """What remediation decided about one finding: drain, blocked, dry_run or none."""

    outcome: str
    reason: str


class CircuitBreaker:
    """Open while the fraction of nodes out exceeds the policy's limit."""

    def __init__(self) -> None:
        self.open = False
        self.since_s: float | None = None
        self.message = ""

    def update(self, out: int, total: int, limit: float, now_s: float) -> bool | None:
        """Recompute; returns True when it just opened, False when it just closed, else None."""
        frac = out / total if total else 0.0
        should_open = total > 0 and frac > limit
        if should_open and not self.open:
            self.open, self.since_s = True, now_s
            self.message = (
                f"circuit breaker open: {out}/{total} nodes ({frac:.0%}) are out, above the "
                f"{limit:.0%} limit; automatic drains are stopped"
            )
            log.warning(self.message)
            return True
        if not should_open and self.open:
            self.open, self.since_s = False, None
            self.message = f"circuit breaker closed: {out}/{total} nodes out"
            log.warning(self.message)
            return False
        if self.open:
            self.message = (
                f"circuit breaker open: {out}/{total} nodes ({frac:.0%}) are out, above the "
                f"{limit:.0%} limit; automatic drains are stopped"
            )
        return None


def decide(
    policy: RemediationPolicy,
    breaker: CircuitBreaker,
    *,
    code: str,
    severity: int,
    message: str,
) -> Decision:
    """Drain or not for one finding, given the policy and the breaker's state."""
    if not policy.wants_drain(code, severity):
        return Decision("none", f"policy does not drain on {code}")
    reason = f"finding {code}: {message}"
    if breaker.open:
        return Decision("blocked", f"{reason} (not drained: {breaker.message})")
    if policy.dry_run:
        return Decision("dry_run", f"{reason} (dry run: would drain)")
    return Decision("drain", reason)
