"""Wiring of one controller: database, store, its one writer thread, the scheduler worker and
the background loop (lost detection, drain completion, rollups, retention), with an injectable
clock. The loop only sends commands to the writer; it never writes itself.

With several replicas on one PostgreSQL (issue 18) every replica serves the API and ingests,
and only the leader (`gpufleet.control.ha.leader`) runs the loop's lifecycle work, campaigns and
retention and the embedded scheduler's placement, each write checked against its fencing
token; every replica re-reads what the others wrote every ``refresh_s``
(`gpufleet.control.ha.replica_sync`). On SQLite the one controller is always the leader.

The loop watches its own pulse: when two of its ticks are further apart than ``stall_s`` (the
process was stopped, the machine suspended, the loop starved), the controller was down, not
the nodes, so every node gets a fresh grace period before it can be declared lost. A freshly
started controller does the same (``ControlStore.grace_from_s``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpufleet.control.campaigns import ops as campaign_ops
from gpufleet.control.campaigns import propose as campaign_propose
from gpufleet.control.db.away import log_failure
from gpufleet.control.db.engine import database_url, make_engine
from gpufleet.control.db.upgrade import migrate_with_backup
from gpufleet.control.ha import replica_sync
from gpufleet.control.ha.leader import DEFAULT_LEASE_S, DEFAULT_RENEW_S, Leadership, StaleLeader
from gpufleet.control.ingest import writes as ingest_writes
from gpufleet.control.ingest.queue import IngestQueue
from gpufleet.control.jobs.events import SchedulerEvents, fail_drain, node_facts
from gpufleet.control.notify import outbox as notify_outbox
from gpufleet.control.power import ops as power_ops
from gpufleet.control.series import rollups
from gpufleet.control.series.forward import check_advertise_url
from gpufleet.control.state import energy_store
from gpufleet.control.state.deafness import JITTER_S
from gpufleet.control.state.limits import DEFAULT_MAX_NODES_PER_TOKEN, NodeQuota
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.control.state.rings import DEFAULT_CAPACITY, TelemetryStore
from gpufleet.control.state.store import ControlStore
from gpufleet.schedulers.base import NoScheduler, SchedulerBackend, SchedulerContext

log = logging.getLogger("gpufleet.control")
sched_log = logging.getLogger("gpufleet.schedulers")


def _log_failure(logger: logging.Logger, what: str, exc: Exception) -> None:
    """A pass of periodic work failed: one line for a lease that moved on (the fence refused
    it; the next pass sees who leads) or the database away, a traceback for anything else."""
    if isinstance(exc, StaleLeader):
        logger.warning("%s: %s", what, exc)
    else:
        log_failure(logger, what, exc)


# the name of the service's tick loop thread (the tests check none is left running)
CONTROL_THREAD = "gpufleet-control"


@dataclass
class ServiceConfig:
    """Settings of one controller (CLI options map onto these)."""

    data_dir: Path | None = None
    db_url: str | None = None
    lost_after_intervals: int = 3
    tick_s: float = 1.0
    stall_s: float = 5.0
    min_drain_s: float = 10.0
    ring_capacity: int = DEFAULT_CAPACITY
    rollup_retention_s: float = 7 * 86400.0
    batch_retention_s: float = 7 * 86400.0  # idempotency window: agents replay within it
    event_retention_s: float = 30 * 86400.0
    energy_retention_s: float = 400 * 86400.0  # energy minutes: a year of reports and more
    max_pending: int = 2000
    policy: RemediationPolicy | None = None
    # how often the token table is checked for changes made elsewhere (CLI, other replicas):
    # a revocation takes effect within about this long on every controller
    token_poll_s: float = 0.1
    max_nodes_per_token: int = DEFAULT_MAX_NODES_PER_TOKEN  # unbound agent tokens; 0: no limit
    # series API reads from this Prometheus (gpufleet.control.series.source); None: memory
    prometheus_url: str | None = None
    # this replica's base URL as the others reach it: recorded with the heartbeats of the nodes
    # it ingests, so they forward raw series reads here (gpufleet.control.series.forward)
    advertise_url: str | None = None
    # a PEM bundle to verify the other replicas' https advertise URLs with (--peer-ca); None:
    # the system trust store
    peer_ca: Path | None = None
    # leader election among replicas (issue 18): the lease, how often it is renewed, how often
    # a replica re-reads what others wrote, and how often a node's last heartbeat is written
    # (with replicas, at most every second: the leader reads it for nodes that push elsewhere)
    lease_s: float = DEFAULT_LEASE_S
    renew_s: float = DEFAULT_RENEW_S
    refresh_s: float = 1.0
    seen_persist_s: float = 10.0
    # how often the minutes that have closed are written (rollups.FLUSH_S)
    rollup_flush_s: float = rollups.FLUSH_S


class ControlService:
    """One controller: call `start()` once, `stop()` at the end; `tick()` drives it in tests."""

    def __init__(
        self,
        config: ServiceConfig,
        *,
        clock: Callable[[], float] = time.time,
        scheduler: SchedulerBackend | None = None,
        auto_migrate: bool = True,
    ) -> None:
        if config.advertise_url is not None:  # before anything is opened: a clear error
            config.advertise_url = check_advertise_url(config.advertise_url)
        self.config = config
        self.clock = clock
        self.url = database_url(config.data_dir, config.db_url)
        self.engine = make_engine(self.url)
        if auto_migrate:  # an older database is backed up first (docs: "Upgrading gpufleet")
            migrate_with_backup(self.engine, self.url, config.data_dir)
        # The scheduler backend (embedded, slurm, kubernetes; none: NoScheduler): lifecycle
        # events reach it through `events`, the jobs API and the agents' exchange call it.
        self.scheduler: SchedulerBackend = scheduler or NoScheduler()
        # several replicas share a PostgreSQL database; SQLite has one controller (lock file)
        self.replicated = not self.url.startswith("sqlite")
        self.leader = Leadership(
            self.engine,
            lease_s=config.lease_s,
            renew_s=config.renew_s,
            exclusive=not self.replicated,
        )
        self.events = SchedulerEvents(self.scheduler, lambda node: fail_drain(self.store, node))
        self.store = ControlStore(
            self.engine,
            clock=clock,
            policy=config.policy,
            hook=self.events,
            batches=ingest_writes.apply_batches,
            telemetry=TelemetryStore(config.ring_capacity),
            lost_after_intervals=config.lost_after_intervals,
            min_drain_s=config.min_drain_s,
            seen_persist_s=min(config.seen_persist_s, 1.0)
            if self.replicated
            else config.seen_persist_s,
        )
        self.store.advertise_url = config.advertise_url
        self.ingest = IngestQueue(self.store, max_pending=config.max_pending)
        self.node_quota = NodeQuota(self.store.sessions, config.max_nodes_per_token)
        self._last_tick: float | None = None
        self._last_slow = 0.0
        self._last_minutes = 0.0
        self._last_refresh = 0.0
        self._synced: replica_sync.Fingerprint | None = None
        self._started = False
        self._took_over: int | None = None  # the epoch whose takeover is done (`_take_over`)
        self._takeover_lock = threading.Lock()
        self._stop = threading.Event()
        # set when the HTTP server begins to shut down: open streams (the dashboards' /stream)
        # end, so a stop never waits for a browser tab to close
        self.closing = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, *, api: bool = False) -> None:
        """Start the background work. ``api``: an API is about to serve this service; no
        node is declared lost until it listens (`ControlStore.api_listening`)."""
        if api:
            self.store.await_api()
        self.leader.start(self._leader_changed)
        self.store.lead = self.leader.wrap
        self._started = True
        self.scheduler.start(
            SchedulerContext(
                self.engine,
                self.clock,
                lambda node: node_facts(self.store, node),
                deliver=self.store.sched.deliver,
                secrets_dir=self.config.data_dir,
                leading=lambda: self.leader.is_leader,
                fenced=self.leader.fenced,
                failed=lambda what, exc: _log_failure(sched_log, what, exc),
            )
        )
        self.events.start()
        self.ingest.start()
        self.store.tokens.watch(self.config.token_poll_s)
        self._last_tick = self.clock()
        self._thread = threading.Thread(target=self._loop, name=CONTROL_THREAD, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.store.tokens.unwatch()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self.flush_rollups(everything=True)
        except Exception as exc:
            log.warning("final rollup flush failed: %s", exc)
        self.ingest.stop()  # the writer finishes what is queued, then ends
        self.store.sched.stop()
        self.events.stop()
        self.scheduler.stop()
        self.leader.stop()  # the lease goes back: another replica leads at its next try
        self.engine.dispose()

    def exchange_elsewhere(self) -> bool:
        """Must an agent's jobs report go to another replica? With the embedded scheduler,
        its commands and the copies it knows of live in the leader's memory
        (`RemoteAgentExecutor`): a replica that does not lead answers such a batch 503."""
        return getattr(self.scheduler, "exchange_on_leader", False) and not self.leading

    @property
    def leading(self) -> bool:
        """Does this controller run the leader's work now? (Always, before ``start``: tests
        drive ``tick`` by hand.)"""
        return not self._started or self.leader.is_leader

    def _leader_changed(self, leading: bool) -> None:
        """On the election's thread: a new leader takes over (`_take_over`)."""
        if leading:
            self._take_over()

    def _take_over(self) -> bool:
        """Once per epoch, before its first leader work: a new leader starts as a restarted
        controller does, its cache read afresh and every node given a grace period (nodes
        that pushed to the old leader are failing over to this one; across a database switch
        their pushes were refused). The control loop asks too, so a pass that runs while the
        election thread has not yet announced the lease waits for (or does) the takeover:
        such a pass declared every node lost (issue 29). False when not leading."""
        epoch = self.leader.epoch
        if epoch is None:
            return False
        with self._takeover_lock:
            if self._took_over != epoch:
                if self._started and not self._stop.is_set():  # start() loaded the cache
                    self.store.writer.call(self.store.load)
                    self.store.begin_grace()
                self._took_over = epoch
        return True

    def _refresh_orders(self) -> None:
        """The maintenance and power orders waiting for agents, re-read (writer thread)."""
        campaign_ops.refresh_orders(self.store)
        power_ops.refresh_orders(self.store)

    def tick(self) -> list[tuple[str, str]]:
        """One pass of the background loop (called every ``tick_s``)."""
        now = self.clock()
        if self._last_tick is not None and now - self._last_tick > self.config.stall_s:
            self.store.note_own_gap(now - self._last_tick)
        self._last_tick = now
        if self.replicated and now - self._last_refresh >= self.config.refresh_s:
            self._last_refresh = now
            self._synced = self.store.writer.call(
                lambda: replica_sync.refresh(
                    self.store, self._synced, lambda: campaign_ops.refresh_orders(self.store)
                )
            )
        moved: list[tuple[str, str]] = []
        leading = self.leading and (not self._started or self._take_over())
        if leading:
            try:
                moved = self.store.check_nodes()
                # maintenance campaigns (issue 15), power orders' policy reverts (issue 16) and
                # the recurring maintenance policy's proposals: on the writer, fenced like
                # check_nodes
                store = self.store
                store.writer.call(store.lead(lambda: campaign_ops.run_pass(store)))
                store.writer.call(store.lead(lambda: power_ops.run_pass(store)))
                if store.policy.maintenance is not None:
                    store.writer.call(store.lead(lambda: campaign_propose.propose(store)))
            except StaleLeader as exc:  # the lease moved on while this replica thought it led
                log.warning("leader work refused: %s", exc)
                leading = False
        if not leading:  # a follower still hands agents the orders the leader recorded
            self.store.writer.call(self._refresh_orders)
        if now - self._last_minutes >= self.config.rollup_flush_s:
            self._last_minutes = now  # closed minutes, in steps (a crash loses the open one)
            rollups.flush_closed(self.store, self.store.writer.call)
        if now - self._last_slow >= 15.0:
            self._last_slow = now
            self.flush_rollups()  # this replica's own minutes (and energy)
            if leading:
                self.apply_retention(
                    rollups_s=self.config.rollup_retention_s,
                    batches_s=self.config.batch_retention_s,
                    events_s=self.config.event_retention_s,
                )
                cutoff = now - self.config.energy_retention_s
                self.store.writer.call(
                    self.store.lead(lambda: energy_store.retain(self.store, cutoff))
                )
        return moved

    def flush_rollups(self, *, everything: bool = False) -> int:
        """Persist closed minutes (all of them when ``everything``, at shutdown) and the energy
        ledger's minutes, on the writer; returns the rollup rows written."""
        store = self.store

        def both() -> int:
            n = rollups.flush_rollups(store, everything=everything)
            energy_store.flush_energy(store)
            return n

        return store.writer.call(both)

    def apply_retention(self, *, rollups_s: float, batches_s: float, events_s: float) -> None:
        """Delete rollups, batch keys and events older than their retention, and the delivered
        and dead notifications of the outbox as old as those events: one writer command per
        table, so ingest commits interleave with the deletes."""
        for step in rollups.retention_steps(
            self.store, rollups_s=rollups_s, batches_s=batches_s, events_s=events_s
        ):
            self.store.writer.call(step)
        cutoff = self.store.clock() - events_s  # sent notifications go with their events

        def outbox() -> None:
            with self.store.sessions.begin() as s:
                notify_outbox.retain(s, cutoff)

        self.store.writer.call(outbox)

    def _loop(self) -> None:
        while True:
            asleep = time.monotonic()
            if self._stop.wait(self.config.tick_s):
                return
            # a late wake means the process was starved or stopped: the agents' pushes waited
            # unread meanwhile, so that span is no node's silence (control/state/deafness.py);
            # recorded before this tick's lost check, which may run before the event loop's
            # own pulse wakes
            late = time.monotonic() - asleep - self.config.tick_s
            if late > JITTER_S:
                now = self.store.clock()
                self.store.deaf.add(now - late, now)
            try:
                self.tick()
            except Exception as exc:
                _log_failure(log, "control loop pass failed", exc)
