"""Remediation policy: which findings drain a node automatically, the circuit breaker that stops
automatic drains when too much of the fleet is already out, and a dry-run mode.

The breaker exists so that a bad rule or a flapping sensor cannot empty the cluster. The rule:
at most ``allowed = max(min_out_nodes, floor(max_out_fraction x nodes))`` nodes may be out
(draining, drained, repair, lost, failed); an automatic drain happens only when the node it
takes out keeps the count within that (``out + 1 <= allowed``). So the breaker is open while
``out >= allowed``: automatic drains stop, an event and a log line say so, and the API flags it
until it closes. ``min_out_nodes`` (default 1) is the floor for small fleets, where 10 % of a
handful of nodes rounds down to none: on 4 nodes, ``min_out_nodes: 2`` lets a second failing node
be drained (its jobs fail over) and blocks the third; on 30 nodes the default allows 3 out.

A drain the breaker blocked is not forgotten: the node stays in service with its fail finding,
its reason reads ``drain blocked by circuit breaker`` (``blocked_drain``), schedulers place no
work there (``gpufleet.control.jobs.events.node_facts``), and once the breaker closes the
controller's loop drains it (``ControlStore.check_nodes``,
`gpufleet.control.state.transitions.retry_blocked_drains`).
"""

from __future__ import annotations

import fnmatch
import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpufleet.errors import ConfigError
from gpufleet.maintenance.recurring import MaintenancePolicy

log = logging.getLogger("gpufleet.control.remediation")
BLOCKED_REASON = "drain blocked by circuit breaker"


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
        description="Circuit breaker: automatic drains may take out at most "
        "max(min_out_nodes, floor(max_out_fraction x nodes)) nodes in all; a drain that would "
        "make more nodes out is blocked.",
    )
    min_out_nodes: int = Field(
        1,
        ge=0,
        description="Circuit breaker floor for small fleets: the breaker opens (automatic "
        "drains stop) only when MORE than max(min_out_nodes, floor(max_out_fraction x nodes)) "
        "nodes would be out, i.e. a drain happens while out + 1 <= that number. Example: "
        "4 nodes, 10 %, min_out_nodes 2 -> 2 nodes may be out, the third failing node is not "
        "drained.",
    )
    dry_run: bool = Field(False, description="Record what would be done; change nothing.")
    require_validation: bool = Field(
        True,
        description="New or repaired nodes wait in validating until a validation result "
        "passes (their agent runs level 1 by itself and posts it; `gpufleet validate "
        "--controller` posts any level); when false, a node whose agent reports no fail "
        "finding goes in service at once.",
    )
    # energy accounting (issue 16, docs/energy.md): unset price or intensity -> no cost or CO2
    energy_price_per_kwh: float | None = Field(
        None,
        ge=0.0,
        le=1e6,
        description="Price of a kWh for energy reports (cost = kWh x price); unset: no cost.",
    )
    energy_currency: str = Field(
        "USD", min_length=1, max_length=8, description="Currency the price is in (a label)."
    )
    grid_gco2_per_kwh: float | None = Field(
        None,
        ge=0.0,
        le=1e5,
        description="Grid carbon intensity, g CO2 per kWh, for energy reports; unset: no CO2.",
    )
    idle_util_pct: float = Field(
        1.0,
        ge=0.0,
        le=100.0,
        description="An in-service GPU below this utilisation counts as idle (idle waste).",
    )
    maintenance: MaintenancePolicy | None = Field(
        None,
        description="Recurring maintenance (docs/maintenance.md): when nodes drift from the "
        "baseline and the next occurrence is near, the controller proposes a campaign.",
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
        return RemediationPolicy.model_validate(data, context={"policy_dir": path.parent})
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


def allowed_out(total: int, max_out_fraction: float, min_out_nodes: int) -> int:
    """How many nodes may be out at most: max(min_out_nodes, floor(max_out_fraction x total))."""
    # The small epsilon keeps 0.1 x 30 = 3.0000000000000004 (or 2.9999...) at 3.
    return max(min_out_nodes, math.floor(max_out_fraction * total + 1e-9))


class CircuitBreaker:
    """Open while no automatic drain may happen: ``out + 1 > allowed_out(...)``."""

    def __init__(self) -> None:
        self.open = False
        self.since_s: float | None = None
        self.message = ""

    def update(
        self, out: int, total: int, limit: float, now_s: float, min_out: int = 1
    ) -> bool | None:
        """Recompute; returns True when it just opened, False when it just closed, else None."""
        allowed = allowed_out(total, limit, min_out)
        should_open = total > 0 and out + 1 > allowed
        text = (
            f"circuit breaker open: {out}/{total} nodes are out and at most {allowed} may be "
            f"(max(min_out_nodes={min_out}, floor({limit:.0%} of {total}))); automatic drains "
            "are stopped"
        )
        if should_open and not self.open:
            self.open, self.since_s = True, now_s
            self.message = text
            log.warning(self.message)
            return True
        if not should_open and self.open:
            self.open, self.since_s = False, None
            self.message = f"circuit breaker closed: {out}/{total} nodes out, {allowed} allowed"
            log.warning(self.message)
            return False
        if self.open:
            self.message = text
        return None


# At least this fraction of the fleet's nodes out of service makes an opening breaker critical.
CRITICAL_OUT_FRACTION = 0.5


def breaker_severity(out: int, total: int, allowed: int) -> int:
    """How loud an opening breaker is, by the capacity at stake (1 warning, 2 critical). It
    opens as soon as the drain budget is used (``out + 1 > allowed``): one drain on a 3-node
    fleet opens it, and the next failing node then waits for a person (a warning). Critical:
    more nodes out than the policy lets automation take (they went lost or failed on their
    own), or at least `CRITICAL_OUT_FRACTION` of the fleet out."""
    if out > allowed or (total > 0 and out / total >= CRITICAL_OUT_FRACTION):
        return 2
    return 1


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


def drain_codes(policy: RemediationPolicy, findings: Iterable[tuple[str, int]]) -> list[str]:
    """The codes among ``(code, severity)`` findings that the policy drains a node for."""
    return [code for code, severity in findings if policy.wants_drain(code, severity)]


def blocked_drain(
    policy: RemediationPolicy, breaker_open: bool, state: str, findings: Iterable[tuple[str, int]]
) -> bool:
    """Is this node kept in service only because the breaker blocks its drain?"""
    return (
        breaker_open
        and not policy.dry_run
        and state == "in_service"
        and bool(drain_codes(policy, findings))
    )
