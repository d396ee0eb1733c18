"""The control plane's state: writes (ingest, lifecycle, actions, validation, audit), each in one
transaction on the one writer thread (`gpufleet.control.state.writer`), with an in-memory cache of
nodes for the hot paths and an immutable snapshot of it for readers (`ControlStore.view`).

The database is the source of truth; the cache (`gpufleet.control.state.cache`) is rebuilt from it
at start and after any failed transaction. Only the writer thread touches the cache; every public
write method here hands its work to the writer (and runs in place when called on it). Scheduler
calls go through `gpufleet.control.state.sched_calls`, never from here directly.

The store reaches what lies outside the kernel only through its ports
(`gpufleet.control.state.ports`): the scheduler (``hook``), the writer of agent batches
(``batches``: `gpufleet.control.ingest.writes`) and a notifier (`tell`); the composition root
(`gpufleet.control.service`) hands them in. Writes from outside the kernel go through a unit of
work (`unit_of_work`) or one of the public methods here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import Any

from sqlalchemy import Engine, event, select
from sqlalchemy.orm import Session

from gpufleet.control.db.away import log_failure
from gpufleet.control.db.engine import session_factory
from gpufleet.control.db.models import (
    AuditEntry,
    ControllerState,
    EventRow,
    FindingRow,
    Gpu,
    Node,
    Rack,
    ValidationResultRow,
)
from gpufleet.control.state import energy_store
from gpufleet.control.state import lifecycle as lc
from gpufleet.control.state import transitions as tr
from gpufleet.control.state import uow as units
from gpufleet.control.state.auth import Principal, TokenStore
from gpufleet.control.state.cache import (
    EMPTY_SNAPSHOT,
    BreakerView,
    FindingCache,
    GpuCache,
    IngestItem,
    NodeCache,
    NodeView,
    Snapshot,
    agent_ack,
    info_digest,
)
from gpufleet.control.state.deafness import DatabaseOutage, DeafTime
from gpufleet.control.state.energy_ledger import EnergyLedger
from gpufleet.control.state.lifecycle import LOSABLE, OUT_STATES, NodeState
from gpufleet.control.state.ports import (
    NO_SCHEDULER,
    BatchWriter,
    NoBatchWriter,
    Notifier,
    RefusedUnchanged,
    SchedulerHook,
)
from gpufleet.control.state.remediation import CircuitBreaker, RemediationPolicy
from gpufleet.control.state.rings import TelemetryStore
from gpufleet.control.state.sched_calls import SchedulerCalls
from gpufleet.control.state.writer import Writer
from gpufleet.wire import AGENT_MAX_BACKOFF_S, AGENT_PUSH_TIMEOUT_S, Ack

log = logging.getLogger("gpufleet.control")
Clock = Callable[[], float]
S = NodeState
__all__ = [
    "ControlStore",
    "FindingCache",
    "GpuCache",
    "IngestItem",
    "NodeCache",
    "NodeView",
    "NotFound",
    "Snapshot",
    "StaleCache",
]
StaleCache = tr.StaleCache


def restart_grace_extra_s(interval_s: float) -> float:
    """What a node gets on top of the lost threshold after the controller (re)starts or stalls:
    its agent's worst retry delay (one attempt that times out, then the backoff cap, never more
    than its heartbeat interval) plus one push interval, so agents that backed off while it was
    down are heard again in time."""
    return AGENT_PUSH_TIMEOUT_S + min(AGENT_MAX_BACKOFF_S, interval_s) + interval_s


class NotFound(LookupError):
    """A named node, finding or token does not exist (the API answers 404)."""


def drained_reason(drain_reason: str) -> str:
    """Why a node went draining -> drained: the drain's own reason stays in front (the
    dashboard's attention list and `gpufleet` tables show a node's newest reason only)."""
    drain_reason = drain_reason.strip()
    return (
        f"{drain_reason} (no work left on the node)" if drain_reason else "no work left on the node"
    )


def _ack_reasons(s: Session, active: list[FindingRow]) -> dict[int, str]:
    """The reasons given when the active sticky findings were acknowledged (from their
    ``finding_acknowledged`` events), so the agent gets the same ``why`` after a restart."""
    acked = {f.id: f for f in active if f.sticky and f.acknowledged_s is not None}
    if not acked:
        return {}
    since = min(f.acknowledged_s or 0.0 for f in acked.values())
    q = (
        select(EventRow.data)
        .where(
            EventRow.kind == "finding_acknowledged",
            EventRow.node.in_({f.node for f in acked.values()}),
            EventRow.at_s >= since,
        )
        .order_by(EventRow.id)
    )
    out: dict[int, str] = {}
    for data in s.scalars(q):
        fid = data.get("finding_id") if isinstance(data, dict) else None
        if fid in acked:
            out[fid] = str(data.get("why") or "")  # the newest acknowledgement wins
    return out


class ControlStore:
    """Writes and cached state of the control plane (one instance per controller process).

    ``nodes`` is the writer's own cache (other threads read ``view``, the newest snapshot)."""

    def __init__(
        self,
        engine: Engine,
        *,
        clock: Clock,
        policy: RemediationPolicy | None = None,
        hook: SchedulerHook | None = None,
        batches: BatchWriter | None = None,
        telemetry: TelemetryStore | None = None,
        lost_after_intervals: int = 3,
        min_drain_s: float = 10.0,
        seen_persist_s: float = 10.0,
    ) -> None:
        self.engine = engine
        self.sessions = session_factory(engine)
        self.clock = clock
        self.policy = policy or RemediationPolicy()
        self.hook: SchedulerHook = hook or NO_SCHEDULER
        self.batches = batches
        self.telemetry = telemetry or TelemetryStore()
        self.tokens = TokenStore(self.sessions, clock)
        self.lost_after_intervals = lost_after_intervals
        self.min_drain_s = min_drain_s
        self.seen_persist_s = seen_persist_s
        # this replica's --advertise-url, recorded with the heartbeats of the nodes it ingests
        # (nodes.rings_url; `gpufleet.control.series.forward`); None: not advertised
        self.advertise_url: str | None = None
        self.breaker = CircuitBreaker()
        self.breaker_told = 0  # the severity of the last breaker event (0: closed)
        # node -> the validation level it must pass at now, where above 1 (a maintenance
        # campaign's `validate_level`: set by the campaigns wing after each pass, read when a
        # validation result arrives)
        self.asked_levels: dict[str, int] = {}
        self.nodes: dict[str, NodeCache] = {}
        self.generation = 0
        self.grace_from_s = clock()  # a fresh controller gives every node a grace period
        # no node is declared lost until the API listens (`await_api`, `api_listening`): a
        # loaded machine can take longer to build the app and bind than a node's lost threshold
        self.awaiting_api = False
        # spans in which this controller's event loop could not hear agents (a starved
        # machine): not counted as a node's silence (`gpufleet.control.state.deafness`)
        self.deaf = DeafTime()
        self.outage = DatabaseOutage(self.deaf, clock)  # the writer reports its database work
        self.stats = {"batches": 0, "duplicates": 0, "samples": 0}
        self.view: Snapshot = EMPTY_SNAPSHOT
        self._dirty: set[str] = set()
        self._dirty_all = True
        # a rebuild of the cache after a failed write failed too (the database away): no
        # command runs on this cache until a rebuild succeeds (`reload_if_due`)
        self._reload_due = False
        self._notify: lc.PostCommit = []
        # wraps the leader's periodic writes in the fencing token's check (the service sets
        # it to `Leadership.wrap`; alone, as in tests and one-shot commands: as they are)
        self.lead: Callable[[Callable[..., Any]], Callable[..., Any]] = lambda fn: fn
        self.writer = Writer(self)
        self.sched = SchedulerCalls(lambda: self.hook, self.writer.submit)
        self.energy = EnergyLedger()  # energy accounting (writer thread; issue 16)
        self.load()
        energy_store.load_counters(self)
        self.publish()

    # -- cache --------------------------------------------------------------------------------
    def load(self, names: Collection[str] | None = None) -> None:
        """(Re)build the node cache from the database: every node (and the policy), or only
        the nodes ``names``."""
        with self.sessions() as s:
            if self.engine.dialect.name == "postgresql":
                # One snapshot for every table read below: under READ COMMITTED each statement
                # sees the commits made since the one before it, so a node another replica
                # registered between the node and GPU reads left a GPU without its node.
                s.connection(execution_options={"isolation_level": "REPEATABLE READ"})
            racks = {r.id: r.name for r in s.scalars(select(Rack))}
            nodes: dict[str, NodeCache] = {}
            by_id: dict[int, NodeCache] = {}
            which = select(Node) if names is None else select(Node).where(Node.name.in_(names))
            for n in s.scalars(which):
                nc = NodeCache(
                    id=n.id,
                    name=n.name,
                    state=n.state,
                    health=n.health,
                    cordoned=n.cordoned,
                    tenant=n.tenant,
                    rack=racks.get(n.rack_id) if n.rack_id else None,
                    agent_id=n.agent_id,
                    interval_s=n.heartbeat_interval_s,
                    last_seen_s=n.last_seen_s,
                    persisted_seen_s=n.last_seen_s or 0.0,
                    rings_url=n.rings_url,
                    state_since_s=n.state_since_s,
                    state_reason=n.state_reason,
                )
                nodes[n.name] = nc
                by_id[n.id] = nc
            gpus = select(Gpu) if names is None else select(Gpu).where(Gpu.node_id.in_(by_id))
            for g in s.scalars(gpus):
                owner = by_id.get(g.node_id)
                if owner is None:  # its node committed after the node read (no snapshot)
                    log.info("load: GPU %s of node id %s skipped: node unread", g.index, g.node_id)
                    continue
                owner.gpus[g.index] = GpuCache(
                    g.id, g.uuid, g.model, info_digest(g.info), g.info.get("power_limit_enforced_w")
                )
            found = select(FindingRow).where(FindingRow.active.is_(True))
            if names is not None:
                found = found.where(FindingRow.node.in_(names))
            active = list(s.scalars(found))
            whys = _ack_reasons(s, active)
            for f in active:
                if f.node in nodes:
                    nodes[f.node].findings[(f.code, f.component)] = FindingCache(
                        f.id,
                        f.severity,
                        f.sticky,
                        True,
                        f.acknowledged_by is not None,
                        agent_ack(
                            f.code,
                            f.component,
                            f.sticky,
                            f.acknowledged_by,
                            f.acknowledged_s,
                            whys.get(f.id, ""),
                        ),
                    )
            saved = s.get(ControllerState, "policy") if names is None else None
            if saved is not None:
                self.policy = RemediationPolicy.model_validate(saved.value)
        if names is None:
            self.nodes = nodes
            self._dirty_all = True
            self._reload_due = False
        else:
            for name in names:
                if name in nodes:
                    self.nodes[name] = nodes[name]
                else:
                    self.nodes.pop(name, None)
                self.dirty(name)
        tr.update_breaker(self, None)

    # -- snapshot -------------------------------------------------------------------------------
    def dirty(self, name: str) -> None:
        """The writer changed node ``name``'s cache: the next snapshot copies it again."""
        self._dirty.add(name)

    def publish(self) -> None:
        """Swap in a new snapshot (on the writer, after each command or group commit), then
        queue the scheduler calls of the commits it holds."""
        old = self.view
        nodes = old.nodes
        out, total = old.out, old.total
        if self._dirty_all:
            nodes = MappingProxyType({n: NodeView.of(nc) for n, nc in self.nodes.items()})
        elif self._dirty:
            fresh = dict(old.nodes)
            for name in self._dirty:
                nc = self.nodes.get(name)
                if nc is None:
                    fresh.pop(name, None)
                else:
                    fresh[name] = NodeView.of(nc)
            nodes = MappingProxyType(fresh)
        if self._dirty_all or self._dirty:
            out, total = self.out_count()
        self._dirty_all = False
        self._dirty.clear()
        b = self.breaker
        self.view = Snapshot(
            generation=self.generation,
            nodes=nodes,
            policy=self.policy,
            breaker=BreakerView(b.open, b.message, b.since_s),
            out=out,
            total=total,
            stats=MappingProxyType(dict(self.stats)),
        )
        calls, self._notify = self._notify, []
        self.sched.notify(calls)

    def after_failure(self, exc: BaseException) -> None:
        """A writer command failed: its transaction rolled back, so the cache may hold changes
        the database does not; rebuild it (unless the command refused before changing
        anything)."""
        if isinstance(exc, NotFound | PermissionError | RefusedUnchanged):
            return  # refused before anything changed
        self._notify = []
        if isinstance(exc, lc.TransitionError) and not self._dirty_all:
            # the state machine refuses before it changes the node: only the nodes the command
            # moved before that (marked dirty since the last snapshot) differ from the database
            if self._dirty:
                try:
                    self.load(set(self._dirty))
                except BaseException:
                    self._reload_due = True
                    raise
            return
        log_failure(log, "write failed; reloading state from the database", exc)
        self.reload()

    def reload(self) -> None:
        """Rebuild the whole cache after a failed write (its transaction rolled back, the cache
        may hold what the database does not); when the rebuild fails too, it is due before
        the next command (`reload_if_due`)."""
        self._reload_due = True
        self.load()

    def reload_if_due(self) -> None:
        """Before each writer command: rebuild a cache whose last rebuild failed. Raises the
        database's error while it is still away, so the command fails (a 503) instead of
        running on a cache that may hold a rolled-back write."""
        if self._reload_due:
            self.load()

    def out_count(self) -> tuple[int, int]:
        nodes = list(self.nodes.values())
        return sum(1 for n in nodes if n.state in OUT_STATES), len(nodes)

    def bump(self) -> None:
        """A write changed what readers see: the next snapshot has a new generation."""
        self.generation += 1

    def unit_of_work(self, *, bump: bool = True) -> AbstractContextManager[units.UnitOfWork]:
        """One transaction on the writer (`gpufleet.control.state.uow`): its transitions'
        scheduler calls are made after the commit, and the generation moves on."""
        return units.unit_of_work(self, bump=bump)

    def tell(self, notifier: Notifier) -> None:
        """Hand every event row and validation result a transaction of this store writes to
        ``notifier``, inside that transaction, and the transaction's end."""

        def collect(session: Session, _ctx: object) -> None:
            for obj in session.new:
                if isinstance(obj, EventRow | ValidationResultRow):
                    notifier.enqueue(session, obj)

        event.listen(self.sessions, "after_flush", collect)
        event.listen(self.sessions, "after_commit", notifier.committed)
        event.listen(self.sessions, "after_rollback", notifier.rolled_back)

    # -- ingest -------------------------------------------------------------------------------
    def touch(self, node: str, now_s: float) -> None:
        """A node was heard from (even a refused batch proves it is alive)."""
        nc = self.nodes.get(node)
        if nc is not None and (nc.last_seen_s is None or now_s > nc.last_seen_s):
            nc.last_seen_s = now_s
            self.dirty(node)

    def apply_batches(self, items: list[IngestItem]) -> list[Ack]:
        """Store a group of batches in one transaction (the writer's group commit), through the
        store's `BatchWriter`; duplicates are acknowledged, not stored."""
        if self.batches is None:
            raise NoBatchWriter("this store takes no agent batches (built without a writer)")
        return self.batches(self, items)

    def run_after(self, after: lc.PostCommit) -> None:
        """Scheduler calls of a committed transaction: made after the next snapshot is out."""
        self._notify.extend(after)

    # -- periodic work ------------------------------------------------------------------------
    def begin_grace(self) -> None:
        """Every node's grace period counts from now (this replica began to lead)."""
        self.writer.call(self._begin_grace)

    def _begin_grace(self) -> None:
        self.grace_from_s = self.clock()

    def await_api(self) -> None:
        """Declare no node lost until `api_listening`: the loop may run before the API does."""
        self.awaiting_api = True

    def api_listening(self) -> None:
        """The API listens from now on: agents can be heard again; their grace starts here."""
        self.writer.call(self._api_listening)

    def _api_listening(self) -> None:
        self.grace_from_s = self.clock()
        self.awaiting_api = False

    def note_own_gap(self, gap_s: float) -> None:
        """The controller itself was not running for ``gap_s``: restart every node's grace."""
        self.writer.call(lambda: self._note_own_gap(gap_s))

    def _note_own_gap(self, gap_s: float) -> None:
        with self.sessions.begin() as s:
            self.grace_from_s = self.clock()
            msg = (
                f"controller loop did not run for {gap_s:.1f} s; every node gets a grace "
                f"period before it can be declared lost"
            )
            log.warning(msg)
            s.add(
                EventRow(
                    at_s=self.grace_from_s,
                    kind="controller_gap",
                    severity=1,
                    message=msg,
                    data={"gap_s": gap_s},
                )
            )
            self.bump()

    def check_nodes(self) -> list[tuple[str, str]]:
        """Declare lost nodes, complete drains; returns (node, new state) pairs. Whether a
        draining node is idle is asked of the scheduler off the writer (`SchedulerCalls.idle`);
        the answer completes the drain later (`_idle_answer`)."""
        return self.writer.call(self.lead(self._check_nodes))

    def _check_nodes(self) -> list[tuple[str, str]]:
        now = self.clock()
        moved: list[tuple[str, str]] = []
        after: lc.PostCommit = []
        with self.sessions.begin() as s:
            for nc in list(self.nodes.values()):
                st = S(nc.state)
                if st in LOSABLE and not self.awaiting_api:
                    seen = max(nc.last_seen_s or 0.0, self.grace_from_s)
                    limit = self.lost_after_intervals * nc.interval_s
                    if (nc.last_seen_s or 0.0) < self.grace_from_s:  # not heard since it began
                        limit += restart_grace_extra_s(nc.interval_s)
                    silent = self.deaf.heard(seen, now)  # not while this controller was deaf
                    if silent > limit and self._heard_elsewhere(s, nc, now - limit):
                        continue
                    if silent > limit:
                        deaf = now - seen - silent
                        why = f"no heartbeat for {now - seen:.1f} s "
                        why += f"({self.lost_after_intervals} x {nc.interval_s:g} s"
                        why += f"; {deaf:.1f} s of it deaf here)" if deaf >= 0.05 else ")"
                        tr.move(self, s, nc, S.LOST, actor="controller", after=after, reason=why)
                        moved.append((nc.name, S.LOST.value))
                        continue
                if (
                    st is S.DRAINING
                    and now - nc.state_since_s >= self.min_drain_s
                    and self.sched.idle(nc.name, nc.state_since_s, self.lead(self._idle_answer))
                ):
                    self._complete_drain(s, nc, after)
                    moved.append((nc.name, S.DRAINED.value))
            if not self.breaker.open:  # drains it blocked while it was open (issue 12)
                moved += [(n, S.DRAINING.value) for n in tr.retry_blocked_drains(self, s, after)]
        self.run_after(after)
        if moved:
            self.bump()
        return moved

    def _heard_elsewhere(self, s: Session, nc: NodeCache, after_s: float) -> bool:
        """Did the node push to another replica since ``after_s`` (its row's ``last_seen_s``,
        which this cache may not have read yet)? Then this cache learns it."""
        seen = s.scalar(select(Node.last_seen_s).where(Node.id == nc.id))
        if seen is None or seen <= after_s:
            return False
        nc.last_seen_s = max(nc.last_seen_s or 0.0, seen)
        self.dirty(nc.name)
        return True

    def _complete_drain(self, s: Session, nc: NodeCache, after: lc.PostCommit) -> None:
        tr.move(
            self,
            s,
            nc,
            S.DRAINED,
            actor="controller",
            after=after,
            reason=drained_reason(nc.state_reason),
        )

    def _idle_answer(self, node: str, since_s: float, idle: bool) -> None:
        """The scheduler's answer to "is ``node`` idle?" (a writer command): complete the drain
        if the node is still in the drain that was asked about."""
        nc = self.nodes.get(node)
        if not idle or nc is None or nc.state != S.DRAINING or nc.state_since_s != since_s:
            return
        after: lc.PostCommit = []
        with self.sessions.begin() as s:
            self._complete_drain(s, nc, after)
        self.run_after(after)
        self.bump()

    # -- audit --------------------------------------------------------------------------------
    def audit(
        self,
        s: Session,
        who: Principal,
        action: str,
        target: str = "",
        outcome: str = "ok",
        detail: dict[str, Any] | None = None,
    ) -> None:
        s.add(
            AuditEntry(
                at_s=self.clock(),
                actor=who.actor,
                role=who.role.value,
                action=action,
                target=target,
                outcome=outcome,
                detail=detail or {},
                tenant=who.tenant,
            )
        )

    def record_audit(
        self,
        who: Principal,
        action: str,
        target: str = "",
        outcome: str = "ok",
        detail: dict[str, Any] | None = None,
    ) -> None:
        """One audit row in its own transaction, written by the writer."""

        def write() -> None:
            with self.sessions.begin() as s:
                self.audit(s, who, action, target, outcome, detail)

        self.writer.call(write)

    def audit_refusal(self, who: Principal, action: str, target: str, why: str) -> None:
        self.record_audit(who, action, target, "refused", {"reason": why})
