"""Wiring of one controller: database, store, its one writer thread, the scheduler worker and
the background loop (lost detection, drain completion, rollups, retention), with an injectable
clock. The loop only sends commands to the writer; it never writes itself.

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

from gpufleet.control import campaign_ops, campaign_propose, energy_store, power_ops
from gpufleet.control.db import database_url, make_engine, migrate
from gpufleet.control.ingest import IngestQueue
from gpufleet.control.limits import DEFAULT_MAX_NODES_PER_TOKEN, NodeQuota
from gpufleet.control.remediation import RemediationPolicy
from gpufleet.control.scheduling import SchedulerEvents, fail_drain, node_facts
from gpufleet.control.store import ControlStore
from gpufleet.control.telemetry_store import DEFAULT_CAPACITY, TelemetryStore
from gpufleet.schedulers.base import NoScheduler, SchedulerBackend, SchedulerContext

log = logging.getLogger("gpufleet.control")


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
    # series API reads from this Prometheus (gpufleet.control.series_source); None: memory
    prometheus_url: str | None = None


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
        self.config = config
        self.clock = clock
        self.url = database_url(config.data_dir, config.db_url)
        self.engine = make_engine(self.url)
        if auto_migrate:
            migrate(self.engine)
        # The scheduler backend (embedded, slurm, kubernetes; none: NoScheduler): lifecycle
        # events reach it through `events`, the jobs API and the agents' exchange call it.
        self.scheduler: SchedulerBackend = scheduler or NoScheduler()
        self.events = SchedulerEvents(self.scheduler, lambda node: fail_drain(self.store, node))
        self.store = ControlStore(
            self.engine,
            clock=clock,
            policy=config.policy,
            hook=self.events,
            telemetry=TelemetryStore(config.ring_capacity),
            lost_after_intervals=config.lost_after_intervals,
            min_drain_s=config.min_drain_s,
        )
        self.ingest = IngestQueue(self.store, max_pending=config.max_pending)
        self.node_quota = NodeQuota(self.store.sessions, config.max_nodes_per_token)
        self._last_tick: float | None = None
        self._last_slow = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.scheduler.start(
            SchedulerContext(
                self.engine,
                self.clock,
                lambda node: node_facts(self.store, node),
                deliver=self.store.sched.deliver,
                secrets_dir=self.config.data_dir,
            )
        )
        self.events.start()
        self.ingest.start()
        self.store.tokens.watch(self.config.token_poll_s)
        self._last_tick = self.clock()
        self._thread = threading.Thread(target=self._loop, name="gpufleet-control", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.store.tokens.unwatch()
        if self._thread is not None:
            self._thread.join(timeout=10)
        try:
            self.store.flush_rollups(everything=True)
        except Exception as exc:
            log.warning("final rollup flush failed: %s", exc)
        self.ingest.stop()  # the writer finishes what is queued, then ends
        self.store.sched.stop()
        self.events.stop()
        self.scheduler.stop()
        self.engine.dispose()

    def tick(self) -> list[tuple[str, str]]:
        """One pass of the background loop (called every ``tick_s``)."""
        now = self.clock()
        if self._last_tick is not None and now - self._last_tick > self.config.stall_s:
            self.store.note_own_gap(now - self._last_tick)
        self._last_tick = now
        moved = self.store.check_nodes()
        campaign_ops.tick(self.store)  # maintenance campaigns (issue 15), on the writer
        power_ops.tick(self.store)  # power orders: policy reverts (issue 16), on the writer
        campaign_propose.tick(self.store)  # the recurring maintenance policy's proposals
        if now - self._last_slow >= 15.0:
            self._last_slow = now
            self.store.flush_rollups()
            self.store.apply_retention(
                rollups_s=self.config.rollup_retention_s,
                batches_s=self.config.batch_retention_s,
                events_s=self.config.event_retention_s,
            )
            cutoff = now - self.config.energy_retention_s
            self.store.writer.call(lambda: energy_store.retain(self.store, cutoff))
        return moved

    def _loop(self) -> None:
        while not self._stop.wait(self.config.tick_s):
            try:
                self.tick()
            except Exception:
                log.exception("control loop pass failed")
