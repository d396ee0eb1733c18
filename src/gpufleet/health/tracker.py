"""`HealthTracker`: runs the enabled rules over a node and keeps the active findings.

Clearing is explicit. A finding whose condition is gone clears by itself (it appears once in
`HealthReport.cleared`), except a sticky one (DBE, remap failure, retired-page limit, GPU lost,
XIDs whose action is reset_gpu or stronger), which stays until `HealthTracker.acknowledge`.
An acknowledged finding stays quiet while the same occurrence persists (the same DBE count, the
same XID event); a new occurrence, or the condition coming back after it was gone, is a new
finding with a new ``first_seen_s``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from gpufleet.devices.types import GpuEvent
from gpufleet.errors import UsageError
from gpufleet.health.acks import (
    Acknowledgement,
    AckStore,
    MemoryAckStore,
    finding_to_dict,
    new_ack_id,
)
from gpufleet.health.config import HealthConfig
from gpufleet.health.context import GpuContext, NodeContext, NodeHealthInput
from gpufleet.health.rules_memory import XidParams
from gpufleet.health.types import Finding, Severity

log = logging.getLogger(__name__)

Key = tuple[str, str]
_EventKey = tuple[int, str, int | None, float]


@dataclass(frozen=True)
class HealthReport:
    """The result of one evaluation of one node."""

    node: str
    evaluated_at_s: float
    verdict: Severity  # worst active finding; UNKNOWN when a GPU (or the node) has no data
    findings: tuple[Finding, ...]  # active, worst first
    gpu_verdicts: dict[str, Severity]  # GPU UUID (or gpu<index>) -> severity
    cleared: tuple[Finding, ...] = ()  # cleared by themselves or acknowledged since last time
    errors: tuple[str, ...] = ()  # rules that raised (the others still ran)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values; severities as words (``ok``, ``warn``, ``fail``, ``unknown``)."""
        return {
            "node": self.node,
            "evaluated_at_s": self.evaluated_at_s,
            "verdict": self.verdict.word,
            "findings": [finding_to_dict(f) for f in self.findings],
            "gpu_verdicts": {k: v.word for k, v in self.gpu_verdicts.items()},
            "cleared": [finding_to_dict(f) for f in self.cleared],
            "errors": list(self.errors),
        }


def _worst_first(findings: list[Finding]) -> tuple[Finding, ...]:
    return tuple(
        sorted(findings, key=lambda f: (-int(f.severity), -f.action.rank, f.component, f.code))
    )


@dataclass
class _State:
    active: dict[Key, Finding] = field(default_factory=dict)
    suppressed: dict[Key, str] = field(default_factory=dict)  # acknowledged occurrence
    pending_cleared: list[Finding] = field(default_factory=list)
    events: dict[_EventKey, GpuEvent] = field(default_factory=dict)
    seen_acks: set[str] = field(default_factory=set)


class HealthTracker:
    """Stateful health of one node: ``evaluate(NodeHealthInput) -> HealthReport``.

    ``clock`` gives the evaluation time (seconds); ``store`` persists acknowledgements and the
    active sticky findings (default: in memory). Events may be handed over once (new events
    per evaluation) or repeatedly (a recent window): the tracker de-duplicates them and keeps
    them for the XID quiet period.
    """

    def __init__(
        self,
        config: HealthConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        store: AckStore | None = None,
    ) -> None:
        self.config = config or HealthConfig()
        self._clock = clock
        self.store: AckStore = store if store is not None else MemoryAckStore()
        self._node: str | None = None
        self._s = _State()

    # ----- acknowledgements ----------------------------------------------------------------
    def acknowledge(self, code: str, component: str, who: str, why: str) -> Acknowledgement:
        """Acknowledge an active sticky finding: it clears now (listed in the next report's
        ``cleared``) and the ack is logged in the store with who, why and when."""
        if not who.strip() or not why.strip():
            raise UsageError("an acknowledgement needs both who and why")
        f = self._s.active.get((code, component))
        if f is None or not f.sticky:
            known = [f"{c} {comp}" for (c, comp), x in self._s.active.items() if x.sticky]
            raise UsageError(
                f"no active sticky finding {code} on {component}",
                hint=f"active sticky findings: {', '.join(known)}" if known else None,
            )
        ack = Acknowledgement(
            code=code,
            component=component,
            who=who,
            why=why,
            at_s=self._clock(),
            node=self._node,
            occurrence=f.occurrence,
            id=new_ack_id(),
        )
        self.store.append(ack)
        self._s.seen_acks.add(ack.id)
        self._apply_ack(ack)
        self._save_sticky()
        return ack

    def acknowledgements(self) -> list[Acknowledgement]:
        """Every acknowledgement in the store's log, oldest first."""
        return self.store.read_all()

    def _apply_ack(self, ack: Acknowledgement) -> None:
        if ack.node is not None and self._node is not None and ack.node != self._node:
            return
        key = (ack.code, ack.component)
        f = self._s.active.get(key)
        if (
            f is not None
            and f.first_seen_s <= ack.at_s
            and (ack.occurrence is None or ack.occurrence == f.occurrence)
        ):
            del self._s.active[key]
            self._s.suppressed[key] = f.occurrence
            self._s.pending_cleared.append(f)
        elif f is None and ack.occurrence is not None:
            self._s.suppressed[key] = ack.occurrence

    def _read_acks(self) -> None:
        for ack in self.store.read_new():
            if ack.id and ack.id in self._s.seen_acks:
                continue
            if ack.id:
                self._s.seen_acks.add(ack.id)
            self._apply_ack(ack)

    def _save_sticky(self) -> None:
        if self._node is None:
            return
        sticky = [f for f in self._s.active.values() if f.sticky]
        try:
            self.store.save_sticky(self._node, sticky)
        except Exception as exc:  # the store must never stop health evaluation
            log.warning("could not persist sticky findings: %s", exc)

    # ----- evaluation ----------------------------------------------------------------------
    @property
    def active(self) -> tuple[Finding, ...]:
        return _worst_first(list(self._s.active.values()))

    def _retention_s(self) -> float:
        p = self.config.params("xid")
        quiet = p.quiet_s if isinstance(p, XidParams) else 300.0
        return max(quiet, 60.0)

    def _merge_events(self, node: NodeHealthInput, now: float) -> dict[int, list[GpuEvent]]:
        for g in node.gpus:
            for ev in g.events:
                self._s.events[(ev.gpu_index, ev.kind, ev.xid, ev.timestamp_s)] = ev
        horizon = now - self._retention_s()
        self._s.events = {
            k: e
            for k, e in self._s.events.items()
            if e.timestamp_s >= horizon or e.kind == "gpu_lost"
        }
        out: dict[int, list[GpuEvent]] = {}
        for ev in sorted(self._s.events.values(), key=lambda e: e.timestamp_s):
            out.setdefault(ev.gpu_index, []).append(ev)
        return out

    def _run_rules(self, node: NodeHealthInput, now: float) -> tuple[list[Finding], list[str]]:
        events = self._merge_events(node, now)
        ctxs = tuple(
            GpuContext(
                node=node.node,
                now_s=now,
                index=g.index,
                uuid=g.uuid or (g.info.uuid if g.info else None),
                info=g.info,
                window=g.window,
                events=tuple(events.get(g.index, ())),
                lost=g.lost,
            )
            for g in node.gpus
        )
        node_ctx = NodeContext(
            node=node.node,
            now_s=now,
            gpus=ctxs,
            driver_version=node.driver_version,
            nvml_version=node.nvml_version,
            cuda_driver_version=node.cuda_driver_version,
        )
        found: list[Finding] = []
        errors: list[str] = []
        for rule in self.config.enabled_rules():
            params = self.config.params(rule)
            targets: tuple[Any, ...] = ctxs if rule.scope == "gpu" else (node_ctx,)
            for ctx in targets:
                try:
                    found.extend(rule.fn(ctx, params))
                except Exception as exc:  # a broken rule must not stop the others
                    errors.append(f"{rule.name}: {type(exc).__name__}: {exc}")
                    log.exception("health rule %s failed", rule.name)
        return found, errors

    def evaluate(self, node: NodeHealthInput) -> HealthReport:
        """Run the enabled rules over ``node`` and update the active findings."""
        now = self._clock()
        if self._node is None:
            self._node = node.node
            for f in self.store.load_sticky(node.node):
                self._s.active.setdefault(f.key, f)
        elif node.node != self._node:
            raise UsageError(
                f"this HealthTracker follows node {self._node!r}, not {node.node!r}",
                hint="use one tracker per node",
            )
        self._read_acks()
        found, errors = self._run_rules(node, now)
        current: dict[Key, Finding] = {}
        for f in found:
            old = current.get(f.key)
            if old is None or f.severity > old.severity:
                current[f.key] = f
        s = self._s
        cleared = list(s.pending_cleared)
        s.pending_cleared.clear()
        sticky_before = {k for k, f in s.active.items() if f.sticky}
        for key, f in current.items():
            if key in s.suppressed:
                if s.suppressed[key] == f.occurrence:
                    continue
                del s.suppressed[key]
            old = s.active.get(key)
            if old is None:
                s.active[key] = replace(f, first_seen_s=now, last_seen_s=now)
            else:
                s.active[key] = replace(
                    f, first_seen_s=old.first_seen_s, last_seen_s=now, sticky=f.sticky or old.sticky
                )
        for key in [k for k in s.suppressed if k not in current]:
            del s.suppressed[key]
        for key in [k for k in s.active if k not in current]:
            if not s.active[key].sticky:
                cleared.append(s.active.pop(key))
        sticky_after = {k for k, f in s.active.items() if f.sticky}
        if sticky_before != sticky_after or sticky_after:
            self._save_sticky()
        findings = _worst_first(list(s.active.values()))
        gpu_verdicts = self._gpu_verdicts(node, findings)
        return HealthReport(
            node=node.node,
            evaluated_at_s=now,
            verdict=self._node_verdict(node, findings, gpu_verdicts),
            findings=findings,
            gpu_verdicts=gpu_verdicts,
            cleared=tuple(cleared),
            errors=tuple(errors),
        )

    @staticmethod
    def _gpu_verdicts(node: NodeHealthInput, findings: tuple[Finding, ...]) -> dict[str, Severity]:
        out: dict[str, Severity] = {}
        for g in node.gpus:
            comp = g.uuid or (g.info.uuid if g.info else None) or f"gpu{g.index}"
            has_data = len(g.window) > 0 or g.info is not None
            out[comp] = Severity.OK if has_data else Severity.UNKNOWN
        for f in findings:
            if f.component == "node":
                continue
            prev = out.get(f.component)
            if prev is None or prev == Severity.UNKNOWN or f.severity > prev:
                out[f.component] = f.severity
        return out

    @staticmethod
    def _node_verdict(
        node: NodeHealthInput, findings: tuple[Finding, ...], gpus: dict[str, Severity]
    ) -> Severity:
        worst = max((f.severity for f in findings), default=Severity.OK)
        if worst >= Severity.WARN:
            return worst
        if not node.gpus or any(v == Severity.UNKNOWN for v in gpus.values()):
            return Severity.UNKNOWN
        return Severity.OK
