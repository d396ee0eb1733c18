"""Drain this node through Slurm when its health verdict is fail, and resume it when healthy
again (``gpufleet health --slurm-drain``, Slurm's HealthCheckProgram).

slurmd ignores the exit code of ``HealthCheckProgram``: slurm.conf(5) says any action must be
"explicitly performed by the program" (its example: ``scontrol update NodeName=foo State=drain
Reason=...``), that the program runs "at the same time on all nodes", and that it is killed after
60 s. So the check drains the node itself, under these rules:

- **Within the circuit breaker.** A drain happens only when a `DrainGuard` allows it: the
  controller's breaker and floor when a controller is configured (`controller_guard`), else a
  local limit on how many Slurm nodes may be out at once, read from ``sinfo`` (`LocalGuard`).
  A guard that cannot answer (controller unreachable, ``sinfo`` failing) means *undecided*:
  nothing is drained or resumed and the caller exits 3.
- **Concurrent checks.** slurmd runs every node's check at the same moment, so two failing nodes
  can both see room for one more drain. After draining, the check reads ``sinfo`` again; when
  the nodes out exceed the limit, the nodes drained by health checks are ranked by name and
  those past the limit resume themselves (`LocalGuard.excess`). A node still failing re-checks
  its place on every run, so the count settles within the limit in one interval.
- **Only its own drains are resumed.** The check's drains carry the reason
  ``gpufleet: health: CODE message`` (`HEALTH_PREFIX`). A node drained for any other reason (by a
  person, or by the controller's Slurm backend, whose reasons read ``gpufleet: ...``) is never
  resumed by the check, and a failing node already drained stays as it is (its reason kept).

Every command goes through `SlurmCommands` (one runner, clear errors); ``sinfo --json`` is read
by `SlurmBackend.node_states`, like the controller's backend does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpufleet.errors import GpufleetError, UsageError
from gpufleet.health.tracker import HealthReport
from gpufleet.health.types import Finding, Severity
from gpufleet.schedulers.base import SchedNodeState
from gpufleet.schedulers.slurm.commands import SlurmCommands, reason_text

HEALTH_PREFIX = "gpufleet: health: "
# The controller's default policy (gpufleet.control.state.remediation.RemediationPolicy): at most
# max(1, floor(10 % of the nodes)) out, so a check without a controller follows the same floor.
DEFAULT_MAX_DRAINED = "10%"
HEALTHY = "healthy, in service"


def drain_reason(finding: Finding) -> str:
    """``gpufleet: health: CODE message`` cut to Slurm's readable length."""
    return reason_text(f"{HEALTH_PREFIX}{finding.code} {finding.message}")


# Slurm node state words (sinfo(1) "NODE STATE CODES", lower case as `SlurmBackend` gives them)
# that take a node's capacity away. Power saving (idle+powered_down) and booting are not out.
# (short forms as sinfo -t prints them, long ones as the --json state flags may spell them)
OUT_WORDS = frozenset(
    {
        *("down", "drain", "drained", "draining", "fail", "failing", "not_responding"),
        *("maint", "maintenance", "inval", "invalid", "invalid_reg"),
    }
)


def is_out(node: SchedNodeState) -> bool:
    """Out of service in Slurm: drained/draining, down, failing, in maintenance."""
    return any(w in OUT_WORDS for w in node.state.split("+"))


def drained_by_check(node: SchedNodeState) -> bool:
    """Drained by a gpufleet health check (and by nothing since)."""
    return "drain" in node.state and node.reason.startswith(HEALTH_PREFIX)


@dataclass(frozen=True)
class Allowance:
    """A guard's answer: may one more node be taken out, and why (said in the log)."""

    allowed: bool
    why: str


class Undecided(GpufleetError):
    """The check cannot tell whether a drain is allowed: it drains nothing (exit 3)."""


class DrainGuard(Protocol):
    """Decides whether ``node`` may be taken out, given Slurm's view of every node."""

    def allows(self, node: str, nodes: Sequence[SchedNodeState]) -> Allowance: ...

    def excess(self, node: str, nodes: Sequence[SchedNodeState]) -> bool:
        """Is ``node``, drained by a check, past the limit now (it must resume itself)?"""
        ...


def parse_max_drained(text: str) -> Callable[[int], int]:
    """``N`` (nodes) or ``P%`` (of the nodes Slurm lists, rounded down, at least 1) -> the
    limit as a function of the node count; a clear error naming the option otherwise."""
    t = text.strip()
    try:
        if t.endswith("%"):
            pct = float(t[:-1])
            if not 0 <= pct <= 100 or math.isnan(pct):
                raise ValueError
            return lambda total: max(1, math.floor(pct / 100 * total + 1e-9))
        n = int(t)
        if n < 0:
            raise ValueError
    except ValueError:
        raise UsageError(
            f"--max-drained {text!r}: expected a node count (e.g. 2) or a percentage (e.g. 10%)"
        ) from None
    return lambda total: n


@dataclass(frozen=True)
class LocalGuard:
    """At most ``limit(nodes listed by sinfo)`` nodes out at once (``--max-drained``)."""

    max_drained: str = DEFAULT_MAX_DRAINED
    limit: Callable[[int], int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "limit", parse_max_drained(self.max_drained))

    def allows(self, node: str, nodes: Sequence[SchedNodeState]) -> Allowance:
        out = sorted(n.name for n in nodes if n.name != node and is_out(n))
        limit = self.limit(len(nodes))
        said = f"{len(out)} of {len(nodes)} Slurm nodes out, at most {limit} (--max-drained "
        said += f"{self.max_drained})"
        if len(out) + 1 > limit:
            shown = ", ".join(out[:5]) + (" ..." if len(out) > 5 else "")
            return Allowance(False, f"drain blocked by circuit breaker: {said}: {shown}")
        return Allowance(True, said)

    def excess(self, node: str, nodes: Sequence[SchedNodeState]) -> bool:
        out = [n for n in nodes if is_out(n)]
        limit = self.limit(len(nodes))
        if len(out) <= limit:
            return False
        ours = sorted(n.name for n in out if drained_by_check(n))
        room = max(0, limit - (len(out) - len(ours)))
        return node in ours[room:]


@dataclass(frozen=True)
class ControllerGuard:
    """The controller's circuit breaker decides (``GET /api/v1/summary``): a drain is allowed
    while the breaker is closed (``out + 1 <= max(min_out_nodes, floor(max_out_fraction x
    nodes))``) and the policy is not a dry run, or when the controller already has the node out.

    ``summary`` and ``node_state`` call the controller (``node_state`` returns None for a node it
    does not know); any error they raise makes the check undecided."""

    summary: Callable[[], Mapping[str, Any]]
    node_state: Callable[[str], str | None]
    url: str = "the controller"

    def allows(self, node: str, nodes: Sequence[SchedNodeState]) -> Allowance:
        try:
            doc = self.summary()
            rem = doc["remediation"]
            state = self.node_state(node)
            circuit_open, dry_run = bool(rem["circuit_open"]), bool(rem["dry_run"])
            out, total = int(rem["out"]), int(rem["total"])
        except GpufleetError as exc:
            raise Undecided(f"cannot ask {self.url} about its circuit breaker: {exc}") from exc
        except (KeyError, TypeError, ValueError) as exc:
            raise Undecided(f"{self.url}: unexpected summary (no {exc})") from exc
        said = f"{self.url}: {out}/{total} nodes out"
        if state is not None and state not in ("in_service", "registering", "validating"):
            return Allowance(True, f"{said}; the controller has {node} {state} already")
        if circuit_open:
            why = str(rem.get("circuit_message") or "circuit breaker open")
            return Allowance(False, f"drain blocked by circuit breaker ({self.url}): {why}")
        if dry_run:
            return Allowance(False, f"{said}; the controller's policy is a dry run: not drained")
        return Allowance(True, f"{said}; circuit breaker closed")

    def excess(self, node: str, nodes: Sequence[SchedNodeState]) -> bool:
        return False  # the controller counts its own drains; it re-decides on its side


@dataclass(frozen=True)
class Outcome:
    """What the check did about Slurm: ``drained``, ``resumed``, ``blocked`` (fail, but the
    guard said no), ``kept`` (left as it is, with why), or ``undecided`` (exit 3)."""

    action: str
    node: str
    detail: str
    argv: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "node": self.node,
            "detail": self.detail,
            "argv": list(self.argv),
        }


def _states(commands: SlurmCommands) -> list[SchedNodeState]:
    from gpufleet.schedulers.slurm.backend import SlurmBackend

    try:
        return SlurmBackend(commands=commands).node_states()
    except GpufleetError as exc:
        raise Undecided(f"cannot read Slurm's node states: {exc}") from exc


def _me(node: str, nodes: Sequence[SchedNodeState]) -> SchedNodeState:
    for n in nodes:
        if n.name == node:
            return n
    raise Undecided(f"Slurm lists no node {node!r} (give --node as Slurm names it)")


def act(report: HealthReport, *, node: str, commands: SlurmCommands, guard: DrainGuard) -> Outcome:
    """Drain, resume or leave ``node`` according to ``report`` and ``guard`` (module docstring);
    never raises for Slurm or the guard: an unanswerable question is an ``undecided`` outcome."""
    try:
        return _act(report, node, commands, guard)
    except Undecided as exc:
        return Outcome("undecided", node, exc.message)
    except GpufleetError as exc:
        return Outcome("undecided", node, f"Slurm refused: {exc.message}")


def _act(report: HealthReport, node: str, commands: SlurmCommands, guard: DrainGuard) -> Outcome:
    if report.verdict == Severity.UNKNOWN:
        return Outcome("undecided", node, "health verdict unknown: no drain, no resume")
    nodes = _states(commands)
    me = _me(node, nodes)
    draining = "drain" in me.state
    if report.verdict != Severity.FAIL:
        if drained_by_check(me):
            argv = commands.resume_args(node)
            commands.run(argv)
            return Outcome("resumed", node, f"healthy again (was: {me.reason})", tuple(argv))
        if draining:
            return Outcome("kept", node, f"drained by someone else ({me.reason!r}): left alone")
        return Outcome("kept", node, HEALTHY)
    worst = next(f for f in report.findings if f.severity == Severity.FAIL)
    if draining and not drained_by_check(me):
        return Outcome("kept", node, f"already drained ({me.reason!r}): reason kept")
    if draining:  # ours, still failing: still within the limit?
        if guard.excess(node, nodes):
            return _back_off(node, commands, "over the limit of nodes out now")
        return Outcome("kept", node, f"still failing, stays drained ({me.reason})")
    allowance = guard.allows(node, nodes)
    if not allowance.allowed:
        return Outcome("blocked", node, f"{worst.code}: {allowance.why}")
    argv = commands.drain_args(node, drain_reason(worst))
    commands.run(argv)
    if guard.excess(node, _states(commands)):  # another check drained at the same moment
        return _back_off(node, commands, f"{worst.code}: another node's check drained first")
    return Outcome("drained", node, f"{worst.code}: {allowance.why}", tuple(argv))


def _back_off(node: str, commands: SlurmCommands, why: str) -> Outcome:
    argv = commands.resume_args(node)
    commands.run(argv)
    detail = f"drain blocked by circuit breaker: {why}; resumed"
    return Outcome("blocked", node, detail, tuple(argv))
