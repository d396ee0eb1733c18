"""`Agent`: the sampler, local health, the /metrics collector and the pusher of one node.

`Agent.tick(now)` does one sampling round and one health evaluation (tests drive it with a
manual clock); `Agent.push_once()` builds and sends one batch; `Agent.run(stop)` is the
real-time loop (sampling on the fast interval, pushing on its own thread). Every iteration is
guarded: an error is counted and logged, and the loop goes on.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.registry import CollectorRegistry

from gpufleet import wire
from gpufleet.agent.gate import ValidationGate
from gpufleet.agent.health_seam import (
    GpuInputs,
    HealthEvaluator,
    HealthOutcome,
    build_input,
    default_evaluator,
)
from gpufleet.agent.jobs import AgentJobs, slots_from_infos
from gpufleet.agent.maintenance import AgentMaintenance
from gpufleet.agent.power import AgentPower
from gpufleet.agent.power_enforce import DEFAULT_CHECK_INTERVAL_S
from gpufleet.agent.push import MAX_BACKOFF_S, Pusher
from gpufleet.agent.spool import DEFAULT_MAX_BATCHES, DEFAULT_MAX_BYTES, AgentState, Spool
from gpufleet.devices.backend import GpuBackend
from gpufleet.devices.deadline import NVML_TIMEOUT_S
from gpufleet.devices.host import HostTopology
from gpufleet.devices.types import GpuEvent
from gpufleet.health.types import Finding, Severity
from gpufleet.telemetry import metrics as M
from gpufleet.telemetry.exposition import (
    AgentCollector,
    ExtraMetric,
    HealthView,
    IdentityMemory,
    make_registry,
    render_text,
)
from gpufleet.telemetry.sampler import (
    DEFAULT_CALL_TIMEOUT_S,
    DEFAULT_FAST_CAPACITY,
    DEFAULT_RECENT,
    DEFAULT_SLOW_CAPACITY,
    Sampler,
    TickResult,
)
from gpufleet.telemetry.workers import CallPool

log = logging.getLogger("gpufleet.agent")

DEFAULT_PUSH_INTERVAL_S = 5.0
MAX_SAMPLES_PER_BATCH = wire.MAX_SAMPLES_PER_BLOCK  # rows per GPU and tier (the wire limit)
PUSH_LOOP_STEP_S = 0.1  # how often the push loop looks at the spool's backoff and push_soon


@dataclass
class AgentConfig:
    """How one agent runs (CLI flags map onto these)."""

    fast_interval_s: float = 1.0
    slow_interval_s: float = 30.0
    call_timeout_s: float = DEFAULT_CALL_TIMEOUT_S
    push_interval_s: float = DEFAULT_PUSH_INTERVAL_S
    controller: str | None = None
    token: str | None = None
    state_dir: Path | None = None
    spool_max_batches: int = DEFAULT_MAX_BATCHES
    spool_max_bytes: int = DEFAULT_MAX_BYTES
    hostname: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    # ring-buffer rows per GPU and the Sample objects kept for health (0: rebuilt from the
    # rings); many simulated agents in one process size these down (gpufleet.agent.fleet)
    fast_capacity: int = DEFAULT_FAST_CAPACITY
    slow_capacity: int = DEFAULT_SLOW_CAPACITY
    recent: int = DEFAULT_RECENT
    heartbeat_interval_s: float | None = None  # announced in each batch; default: push interval
    seq_block: int = 1  # sequence numbers reserved per state-file write (`AgentState`)
    # what the host's readiness checks found at start (`gpufleet.readiness`: driver module,
    # fabric manager, peermem, InfiniBand ports...), sent with every batch as node findings
    host_findings: tuple[Finding, ...] = ()
    # this host's CPUs and memory (`gpufleet.devices.host.read_host`), sent with the devices;
    # None on simulated nodes (they are not this host)
    host: HostTopology | None = None
    # one of many agents of one process (`gpufleet up`, `gpufleet sim-fleet`): an update
    # command gets no GPUFLEET_AGENT_PID (signalling it would stop every agent), and the
    # driver reopens the agent in place after an update (`FleetDriver`)
    in_process: bool = False
    # `gpufleet validate` on this node, without ``--level``: what the agent runs when a
    # maintenance campaign asks level 2 or 3 (`ValidationGate`); empty: level 1 only
    validate_argv: tuple[str, ...] = ()
    # how often the power limits of fleet power orders are checked and set again where a
    # reboot, a driver reload or `nvidia-smi -pl` changed them (`gpufleet.agent.power_enforce`)
    power_check_interval_s: float = DEFAULT_CHECK_INTERVAL_S
    # where `power sweep --clocks` records the clocks it locks (`gpufleet.energy.clocks`): at
    # start the agent resets those a crashed sweep left locked; None: not looked at
    clock_state_file: Path | None = None


CLOCKS_RESET = "locked_clocks_reset"  # the device event of a reset at start


def _recover_clocks(
    backend: GpuBackend, state: Path, now_s: float
) -> tuple[list[int], list[wire.WireEvent]]:
    """Reset clocks a crashed `power sweep --clocks` left locked, with a device event per GPU
    for the first batch (what was locked, by which process); a failure is logged, never stops
    the agent."""
    from gpufleet.energy.clocks import read_clock_state, recover_locked_clocks

    try:
        records = read_clock_state(state).get(str(backend.node_name), {})
        reset = recover_locked_clocks(backend, state)
    except Exception as exc:
        log.warning("locked clocks left by a crashed sweep not reset: %s", exc)
        return [], []
    events = []
    for g in reset:
        rec = records.get(str(g), {})
        lo, hi = rec.get("min_mhz"), rec.get("max_mhz")
        mhz = f"{lo} MHz" if lo == hi else f"{lo}-{hi} MHz"
        detail = (
            f"locked clocks reset on gpu {g} at agent start: {mhz}, left locked by process "
            f"{rec.get('pid')}, which ended without resetting them"
        )
        events.append(
            wire.WireEvent(gpu_index=g, kind=CLOCKS_RESET, timestamp_s=now_s, detail=detail)
        )
    return reset, events


def finding_to_wire(f: Finding) -> wire.WireFinding:
    return wire.WireFinding(
        rule=f.rule,
        code=f.code,
        severity=int(f.severity),
        component=f.component,
        message=f.message,
        action=str(f.action.value if hasattr(f.action, "value") else f.action),
        evidence=_jsonable(f.evidence),
        sticky=f.sticky,
        gpu_index=f.gpu_index,
        first_seen_s=f.first_seen_s,
        last_seen_s=f.last_seen_s,
    )


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    from gpufleet.jsonable import to_jsonable

    out = to_jsonable(d)
    return out if isinstance(out, dict) else {}


class Agent:
    """One node's agent; thread-safe readers for the HTTP server."""

    def __init__(
        self,
        backend: GpuBackend,
        config: AgentConfig | None = None,
        *,
        clock: Callable[[], float] = time.time,
        evaluator: HealthEvaluator | None = None,
        transport: httpx.BaseTransport | None = None,
        calls: CallPool | None = None,
        client: httpx.Client | None = None,
        validations: Executor | None = None,
    ) -> None:
        """``calls``: a thread pool shared by many agents for their device calls (else one
        thread per GPU); ``client``: an HTTP client shared by many agents (else their own);
        ``validations``: where level-1 validations run (`gpufleet.agent.gate`; else a thread
        of this agent's own)."""
        self.config = cfg = config or AgentConfig()
        self.clock = clock
        self.backend = backend
        self.clocks_reset: list[int] = []  # GPUs whose crashed-sweep clock locks were reset
        reset_events: list[wire.WireEvent] = []
        if cfg.clock_state_file is not None:
            self.clocks_reset, reset_events = _recover_clocks(
                backend, cfg.clock_state_file, clock()
            )
        self.sampler = Sampler(
            backend,
            fast_interval_s=cfg.fast_interval_s,
            slow_interval_s=cfg.slow_interval_s,
            call_timeout_s=cfg.call_timeout_s,
            fast_capacity=cfg.fast_capacity,
            slow_capacity=cfg.slow_capacity,
            recent=cfg.recent,
            clock=clock,
            calls=calls,
        )
        self.hostname = cfg.hostname or backend.node_name
        self.evaluate = evaluator or default_evaluator(clock, cfg.state_dir)
        self.health = HealthOutcome()
        self.health_errors = 0
        self.loop_errors = 0
        self.push_errors = 0
        self._health_lock = threading.Lock()
        self._pending_events: list[wire.WireEvent] = reset_events  # sent in the first batch
        self._cursors: dict[tuple[int, str], int] = {}
        self._devices_sent = -1
        self.pusher: Pusher | None = None
        self.gate: ValidationGate | None = None  # level 1 when the control plane asks
        self._validate_for: float | None = None  # asked; waits for a fresh slow round
        self._validate_level = 1  # the level the newest Ack asks (2, 3: a campaign)
        self.state: AgentState | None = None
        self.jobs: AgentJobs | None = None  # set by enable_jobs (issue 7)
        self.push_soon = threading.Event()  # a copy started or stopped: report it now
        self.acks_applied = 0  # acknowledgements from the control plane applied to the tracker
        self._acks_lock = threading.Lock()
        self._pending_acks: dict[tuple[str, str], wire.WireAck] = {}
        if cfg.controller:
            if cfg.state_dir is None:  # pragma: no cover - the CLI always passes one
                from gpufleet.errors import UsageError

                raise UsageError("--controller needs --state-dir (sequence numbers and spool)")
            self.state = AgentState(cfg.state_dir, backend.node_name, seq_block=cfg.seq_block)
            spool = Spool(
                cfg.state_dir / "spool",
                max_batches=cfg.spool_max_batches,
                max_bytes=cfg.spool_max_bytes,
            )
            self.pusher = Pusher(
                cfg.controller,
                cfg.token or "",
                self.state,
                spool,
                transport=transport,
                clock=clock,
                client=client,
                # back in contact within a heartbeat interval once the control plane returns
                max_backoff_s=min(MAX_BACKOFF_S, cfg.heartbeat_interval_s or cfg.push_interval_s),
            )
            self.pusher.on_ack = self.on_ack
            self.gate = ValidationGate(
                backend,
                lambda: self.pusher.base_url if self.pusher else cfg.controller or "",
                cfg.token or "",
                health=lambda: (self.health.verdict, self.health.findings),
                client=self.pusher.client,
                executor=validations,
                clock=clock,
                validate_argv=cfg.validate_argv,
            )
        self.maintenance: AgentMaintenance | None = None  # update orders (issue 15)
        if cfg.controller and cfg.state_dir is not None and self.pusher is not None:
            self.maintenance = AgentMaintenance(
                cfg.state_dir,
                backend.node_name,
                cfg.controller,
                cfg.token or "",
                self.pusher.client,
                close_devices=lambda: self.sampler.close(wait_s=5.0),
                agent_pid=None if cfg.in_process else os.getpid(),
            )
            if self.maintenance.updating.is_set():  # an update ran while the agent was down
                self.sampler.close(wait_s=5.0)
        self.power: AgentPower | None = None  # fleet-wide power orders (issue 16)
        if cfg.controller and cfg.state_dir is not None and self.pusher is not None:
            self.power = AgentPower(
                cfg.state_dir,
                backend,
                backend.node_name,
                cfg.controller,
                cfg.token or "",
                self.pusher.client,
                check_interval_s=cfg.power_check_interval_s,
                paused=self._nvml_paused,
            )
            self.power.start()  # limits in force from before a restart are checked
        self._registry: CollectorRegistry | None = None
        self._slots: tuple[int, list[wire.WireSlot]] = (-1, [])

    def _nvml_paused(self) -> bool:
        return self.maintenance is not None and self.maintenance.updating.is_set()

    @property
    def registry(self) -> CollectorRegistry:
        """The /metrics registry, made on first use (most simulated agents are never scraped)."""
        if self._registry is None:
            collector = AgentCollector(
                self.sampler,
                hostname=self.hostname,
                health=self.health_view,
                extra=self.extra_metrics,
                # a GPU lost before the agent (re)started keeps the labels it had (issue 18)
                identities=IdentityMemory(
                    None
                    if self.config.state_dir is None
                    else self.config.state_dir / "gpu-identities.json"
                ),
            )
            self._registry = make_registry(collector)
        return self._registry

    # ----- sampling and health ---------------------------------------------------------------
    def tick(self, now: float | None = None) -> TickResult | None:
        """One sampling round and one health evaluation; never raises."""
        if self.maintenance is not None and self.maintenance.updating.is_set():
            return None  # NVML is shut down for the update: nothing to sample
        try:
            result = self.sampler.tick(now)
        except Exception:
            self.loop_errors += 1
            log.exception("sampling round failed")
            return None
        try:
            self._evaluate(result)
        except Exception:
            self.health_errors += 1
            log.exception("health evaluation failed")
        return result

    def _evaluate(self, result: TickResult) -> None:
        s = self.sampler
        with s.lock:
            inputs = [
                GpuInputs(
                    index=g.index,
                    info=g.info,
                    samples=s.window(g),
                    events=(*g.new_events, *self._hung(g.index, g.info, g.stalled, result.now)),
                    lost=g.lost,
                    stalled=g.stalled,
                )
                for g in s.gpus
            ]
            for ev in result.events:
                self._pending_events.append(
                    wire.WireEvent(
                        gpu_index=ev.gpu_index,
                        gpu_uuid=ev.gpu_uuid,
                        kind=ev.kind,
                        timestamp_s=ev.timestamp_s,
                        xid=ev.xid,
                        detail=ev.detail,
                    )
                )
            del self._pending_events[: max(0, len(self._pending_events) - 10_000)]
        self._apply_acks()
        outcome = self.evaluate(build_input(s.node, inputs))
        with self._health_lock:
            self.health = outcome
        since = self._validate_for
        if since is not None and result.slow and self.gate is not None:
            self._validate_for = None
            self.gate.wanted(since, self._validate_level)  # on device info read this round

    def _hung(self, index: int, info: Any, stalled: bool, now: float) -> tuple[GpuEvent, ...]:
        """An ``nvml_timeout`` event while GPU ``index``'s NVML call has hung past the device
        layer's deadline (`gpufleet.devices.deadline.NVML_TIMEOUT_S`): the health rule
        ``gpu_unresponsive`` makes it a fail finding (GPU_NVML_TIMEOUT) that reaches the
        control plane, which drains the node like any failed GPU. The call began at most one
        deadline counts from when the call began to run (`Sampler.call_running_s`): a call still
        waiting for a thread on a starved machine has not hung."""
        if not stalled:
            return ()
        running = self.sampler.call_running_s(index)
        if running is None or running < NVML_TIMEOUT_S:
            return ()
        detail = f"GPU {index} did not answer NVML within {NVML_TIMEOUT_S:g} s"
        uuid = info.uuid if info is not None else None
        return (GpuEvent(index, uuid, "nvml_timeout", now, detail=detail),)

    def health_view(self) -> HealthView:
        h = self.health
        return HealthView(node=int(h.verdict), gpus={k: int(v) for k, v in h.gpu_verdicts.items()})

    # ----- outputs ---------------------------------------------------------------------------
    def render_metrics(self) -> bytes:
        return render_text(self.registry)

    def health_doc(self) -> dict[str, Any]:
        h = self.health
        return {
            "node": self.hostname,
            "verdict": int(h.verdict),
            "verdict_word": Severity(h.verdict).word,
            "gpus": {str(k): Severity(v).word for k, v in sorted(h.gpu_verdicts.items())},
            "findings": [finding_to_wire(f).model_dump(mode="json") for f in h.findings],
        }

    def healthz(self) -> tuple[bool, dict[str, Any]]:
        age = self.sampler.healthy_age_s()
        limit = max(3 * self.config.fast_interval_s, 5.0)
        ok = age <= limit
        return ok, {"ok": ok, "last_round_age_s": None if math.isinf(age) else round(age, 3)}

    def extra_metrics(self) -> Iterable[ExtraMetric]:
        yield ExtraMetric(
            "gpufleet_agent_errors",
            "counter",
            "Errors caught by the agent's loops, per part.",
            float(self.loop_errors + self.sampler.tick_errors),
            (("part", "sampler"),),
        )
        yield ExtraMetric(
            "gpufleet_agent_health_errors",
            "counter",
            "Health evaluations that failed.",
            float(self.health_errors),
        )
        p = self.pusher
        if p is None:
            return
        yield ExtraMetric(M.BUFFER_DEPTH, "gauge", "", float(len(p.spool)), (("buffer", "spool"),))
        st = p.stats
        for name, help_, value in (
            ("gpufleet_agent_push_acked", "Batches acknowledged by the control plane.", st.acked),
            (
                "gpufleet_agent_push_failures",
                "Push attempts that will be retried.",
                st.retryable_failures,
            ),
            (
                "gpufleet_agent_push_rejected",
                "Batches the control plane rejected (dropped).",
                st.rejected,
            ),
            (
                "gpufleet_agent_spool_dropped",
                "Spooled batches dropped because the spool was full.",
                p.spool.dropped,
            ),
            (
                "gpufleet_agent_push_schema_refused",
                "Sends refused for a wire schema newer than the control plane's (batches kept).",
                st.schema_refused,
            ),
        ):
            yield ExtraMetric(name, "counter", help_, float(value))
        yield ExtraMetric(
            "gpufleet_agent_control_plane_older",
            "gauge",
            "1 while the control plane refuses this agent's wire schema as newer than its own.",
            float(p.older_control_plane is not None),
        )

    # ----- push ------------------------------------------------------------------------------
    def build_batch(self, seq: int) -> wire.Batch:
        s = self.sampler
        samples: list[wire.WireSamples] = []
        with s.lock:
            devices = None
            if self._devices_sent != s.devices_version:
                devices = [
                    wire.WireDevice(index=g.index, uuid=g.info.uuid, info=_jsonable(vars(g.info)))
                    for g in s.gpus
                    if g.info is not None
                ]
                self._devices_sent = s.devices_version
            for g in s.gpus:
                for tier, ring in (("fast", g.fast), ("slow", g.slow)):
                    key = (g.index, tier)
                    t, rows, count = ring.since(self._cursors.get(key, 0))
                    self._cursors[key] = count
                    if len(t) == 0:
                        continue
                    t, rows = t[-MAX_SAMPLES_PER_BATCH:], rows[-MAX_SAMPLES_PER_BATCH:]
                    fields = {
                        name: [None if math.isnan(v) else float(v) for v in rows[:, i].tolist()]
                        for i, name in enumerate(ring.columns)
                        if not bool(all(math.isnan(v) for v in rows[:, i].tolist()))
                    }
                    samples.append(
                        wire.WireSamples(
                            gpu_uuid=g.uuid, gpu_index=g.index, t=t.tolist(), fields=fields
                        )
                    )
            events, self._pending_events = self._pending_events, []
        if self.power is not None:  # limits in force set again (or refused)
            events.extend(self.power.take_events())
        h = self.health
        assert self.state is not None
        host = self.config.host
        return wire.Batch(
            node=s.node,
            agent_id=self.state.agent_id,
            seq=seq,
            sent_at_s=self.clock(),
            heartbeat_interval_s=self.config.heartbeat_interval_s or self.config.push_interval_s,
            devices=devices,
            host=wire.WireHost(**vars(host)) if host is not None and devices is not None else None,
            samples=samples,
            findings=[finding_to_wire(f) for f in (*h.findings, *self.config.host_findings)],
            events=events,
            health=max([int(h.verdict), *(int(f.severity) for f in self.config.host_findings)]),
            jobs=self.jobs.report() if self.jobs is not None else None,
        )

    def enable_jobs(self, jobs: AgentJobs) -> None:
        """Run the jobs the control plane sends in its ``Ack``s, report them in each batch.
        Jobs made without slots report the GPUs the sampler identified (`gpu_slots`)."""
        if isinstance(jobs, AgentJobs) and not callable(jobs.slots) and not jobs.slots:
            jobs.slots = self.gpu_slots
        self.jobs = jobs
        if self.pusher is not None:
            self.pusher.on_ack = self.on_ack

    def gpu_slots(self) -> list[wire.WireSlot]:
        """The node's schedulable GPUs as the sampler identified them (read on its lanes, so a
        hung NVML call never blocks a job report; lost GPUs are left out)."""
        s = self.sampler
        with s.lock:
            if self._slots[0] != s.devices_version:
                infos = [(g.index, g.info) for g in s.gpus if g.info is not None and not g.lost]
                self._slots = (s.devices_version, slots_from_infos(infos))
            return self._slots[1]

    def on_ack(self, ack: wire.Ack) -> None:
        """What an ``Ack`` asks (the pusher's callback, on its thread): acknowledgements are
        queued for the sampling thread, which owns the health tracker (`_apply_acks`); job
        commands go to the jobs runner when jobs are enabled."""
        if ack.acks:
            with self._acks_lock:
                for a in ack.acks:
                    self._pending_acks[(a.code, a.component)] = a
        since = ack.validate_since_s
        self._validate_level = ack.validate_level or 1
        gate = self.gate
        if (
            gate is not None
            and since is not None
            and self._validate_for != since
            and gate.due(since)
        ):
            # the sampling thread starts it after a slow round re-read the device info
            with self.sampler.lock:
                self.sampler.last_slow_s = None
            self._validate_for = since
        m = self.maintenance
        if ack.update is not None and m is not None and m.order(ack.update):
            self.push_soon.set()
        if self.power is not None:
            if ack.power:
                self.power.orders(ack.power)
            self.power.acked()  # after its orders: the first Ack starts the limits' check
        if self.jobs is not None and self.jobs.apply(ack.commands):
            self.push_soon.set()  # report the started or stopped copies now

    def _apply_acks(self) -> None:
        """Acknowledge in the health tracker the findings acknowledged on the control plane (its
        ack log records who and why); ones no longer active are ignored. The evaluation that
        follows drops them, and so does the next snapshot."""
        with self._acks_lock:
            pending, self._pending_acks = self._pending_acks, {}
        if not pending:
            return
        tracker = getattr(self.evaluate, "tracker", None)
        if tracker is None:
            log.info("no health tracker: %d acknowledgement(s) ignored", len(pending))
            return
        for (code, component), a in pending.items():
            if not any(f.sticky and f.key == (code, component) for f in tracker.active):
                log.debug("acknowledgement of %s on %s: no longer active", code, component)
                continue
            try:
                tracker.acknowledge(code, component, a.who, a.why)
            except Exception:  # a failing ack log must not stop the health evaluation
                self.health_errors += 1
                log.exception("acknowledging %s on %s failed", code, component)
                continue
            self.acks_applied += 1
            log.info("%s on %s acknowledged on the control plane by %s", code, component, a.who)

    def push_once(self) -> None:
        """Build one batch and send (or spool) it, then replay the spool; never raises."""
        if self.pusher is None:
            return
        if self.maintenance is not None:
            try:
                self.maintenance.poll()
            except Exception:
                log.exception("maintenance: reporting an update failed")
        if self.power is not None:
            try:
                self.power.poll()
            except Exception:
                log.exception("power: reporting an order failed")
        try:
            self.pusher.push(self.build_batch)
        except Exception:
            self.push_errors += 1
            log.exception("push failed")

    # ----- real-time loop --------------------------------------------------------------------
    def run(self, stop: threading.Event, duration_s: float | None = None) -> None:
        """Sample on schedule until ``stop`` is set (or ``duration_s`` of wall time passed)."""
        end = None if duration_s is None else time.monotonic() + duration_s
        pusher = None
        if self.pusher is not None:
            pusher = threading.Thread(
                target=self._push_loop, args=(stop,), name="gpufleet-push", daemon=True
            )
            pusher.start()
        while not stop.is_set():
            if end is not None and time.monotonic() >= end:
                break
            if self.restart_wanted:
                break
            try:
                self.tick()
                wait = self.sampler.next_due() - self.clock()
            except Exception:
                self.loop_errors += 1
                log.exception("agent loop iteration failed")
                wait = self.config.fast_interval_s
            stop.wait(min(max(wait, 0.01), self.config.fast_interval_s))
        stop.set()
        if pusher is not None:
            pusher.join(timeout=10)
            self.push_once()  # flush what was sampled since the last push

    @property
    def restart_wanted(self) -> bool:
        """A maintenance update ended and was reported: the process should start afresh."""
        return self.maintenance is not None and self.maintenance.restart_wanted.is_set()

    def push_every_s(self) -> float:
        """The push period: the push interval, or the jobs exchange period when shorter."""
        every = self.config.push_interval_s
        return min(every, self.jobs.exchange_s) if self.jobs is not None else every

    def _push_loop(self, stop: threading.Event) -> None:
        """A batch every push period (`push_every_s`), and at once when `push_soon` is set (a
        copy started or stopped); while batches wait after a failure, the spool is also replayed
        as soon as the backoff allows (`Pusher.retry_in_s`), so contact resumes within the
        backoff cap of the control plane's return, not a push period later."""
        next_push = time.monotonic() + self.push_every_s()
        while True:
            while not stop.is_set() and not self.push_soon.is_set():
                left = next_push - time.monotonic()
                if left <= 0:
                    break
                self._replay_if_due()
                self.push_soon.wait(min(left, PUSH_LOOP_STEP_S))
            if stop.is_set():
                return
            self.push_soon.clear()
            next_push = time.monotonic() + self.push_every_s()
            self.push_once()

    def _replay_if_due(self) -> None:
        """Send the spool now if batches wait and the backoff allows it."""
        pusher = self.pusher
        if pusher is None or pusher.retry_in_s() != 0.0:
            return
        try:
            pusher.replay()
        except Exception:
            self.push_errors += 1
            log.exception("replaying the spool failed")

    def close(self, wait_s: float = 2.0) -> bool:
        """Stop sampling and release NVML (bounded: False when a hung call kept it
        initialised, see `Sampler.close`), then the HTTP client."""
        if self.gate is not None:
            self.gate.close()
        if self.power is not None:
            self.power.close()
        done = self.sampler.close(wait_s=wait_s)
        if self.pusher is not None:
            self.pusher.close()
        return done
