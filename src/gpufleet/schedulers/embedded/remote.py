"""``RemoteAgentExecutor``: the embedded scheduler's ``JobExecutor`` over the agents' pushes
(what `EmbeddedBackend` runs jobs with inside the control plane).

The control plane never calls an agent: agents push batches. Each batch from an agent that runs
jobs carries a ``jobs`` report (its GPUs, lease and copies); the answer (``Ack``) carries the
commands for that node. So ``start``/``kill`` queue commands, ``poll`` answers from the newest
report (plus the starts not yet confirmed, as running), and a node whose last report is older
than ``stale_s`` is unreachable (``NodeUnreachable``): what runs there is unknown.

A new command also goes to ``deliver`` (the control plane's outbox, `SchedulerContext.deliver`)
the moment it is queued, so it rides on the node's very next ``Ack`` instead of the one after
the node's next report. Commands repeat in every ``Ack`` until the report shows them done
(agents treat repeats as no-ops), so a lost answer loses nothing. Until a report shows a
started copy, ``poll`` answers it as a ``CopyReport`` with ``confirmed=False`` and the job stays
``starting``. A start that the agent never shows within ``start_timeout_s`` after it was sent
is dropped: the scheduler then sees the copy vanished and requeues the job.

A kill the agent has not confirmed yet makes the scheduler hold the job back; ``copy_gone``
answers True once a fresh report of that node shows the copy ended (positive confirmation, so
the job starts elsewhere within about two exchanges instead of waiting for the lease).

Reports from old batches (replayed after an outage: ``sent_at_s`` older than ``stale_s``, or a
sequence number not above the newest) are ignored: a stale snapshot would hide newer copies.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.schedulers.embedded.executor import CopyReport, Launch, NodeUnreachable
from gpufleet.schedulers.embedded.placement import GpuSlot, NodeInfo
from gpufleet.wire import Batch, WireCommand

Key = tuple[str, int]  # (job id, generation)


@dataclass
class NodeView:
    """The newest jobs report of one node."""

    agent_id: str
    seq: int
    seen_s: float
    lease_s: float
    info: NodeInfo
    copies: dict[Key, CopyReport] = field(default_factory=dict)


@dataclass
class _PendingStart:
    launch: Launch
    sent_s: float | None = None


def _running(copies: Mapping[Key, CopyReport]) -> set[Key]:
    return {k for k, c in copies.items() if c.running}


class RemoteAgentExecutor:
    """Commands to agents through ``Ack``s; copies known from their ``jobs`` reports."""

    # ``start`` only queues the command: the scheduler keeps the job ``starting`` until an
    # agent's report shows the copy, so ``running`` in the store means "an agent confirmed it".
    confirms_starts = True

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        stale_s: float = 10.0,
        start_timeout_s: float = 30.0,
        default_lease_s: float = 30.0,
    ) -> None:
        self.clock = clock
        self.stale_s = stale_s
        self.start_timeout_s = start_timeout_s
        # The scheduler may start a job elsewhere once an unconfirmed kill is this old: the
        # agent's lease (it kills its own copies when cut off) plus the report staleness.
        self.lease_s = default_lease_s + stale_s
        self.views: dict[str, NodeView] = {}
        self.starts: dict[str, dict[Key, _PendingStart]] = {}
        self.kills: dict[str, set[Key]] = {}
        self.stops: dict[Key, tuple[str, float]] = {}  # kills that are checkpoint stops
        self.logs: dict[Key, str] = {}
        # set when a report shows a copy started or ended: the scheduler ticks at once
        # (a killed copy's job may start elsewhere, a start counts as running)
        self.changed = threading.Event()
        self.deliver: Callable[[str, list[WireCommand]], None] | None = None
        self._lock = threading.Lock()

    # ----- the exchange (called for every ingested batch) -------------------------------------
    def observe(self, batch: Batch, now: float) -> tuple[list[WireCommand], NodeInfo | None]:
        """Take the batch's jobs report; return the commands for its node and, when the node is
        new or its GPUs changed, its ``NodeInfo``."""
        rep = batch.jobs
        if rep is None:
            return [], None
        node = batch.node
        changed: NodeInfo | None = None
        with self._lock:
            view = self.views.get(node)
            fresh = now - batch.sent_at_s <= self.stale_s and not batch.buffered
            newer = view is None or view.agent_id != batch.agent_id or batch.seq > view.seq
            if fresh and newer:
                info = NodeInfo(
                    node,
                    tuple(GpuSlot(s.index, s.model, s.memory_bytes) for s in rep.slots),
                )
                if view is None or view.info.gpus != info.gpus:
                    changed = info
                copies = {
                    (c.job_id, c.generation): CopyReport(
                        c.job_id,
                        c.generation,
                        node,
                        c.running,
                        c.exit_code,
                        c.reason,
                        c.node_fault,
                        fenced=c.fenced,
                    )
                    for c in rep.copies
                }
                for c in rep.copies:
                    if c.log_tail is not None:
                        self.logs[(c.job_id, c.generation)] = c.log_tail
                if view is None or _running(view.copies) != _running(copies):
                    self.changed.set()
                view = NodeView(batch.agent_id, batch.seq, now, rep.lease_s, info, copies)
                self.views[node] = view
                # the longest lease an agent now reports (the default until one reports)
                self.lease_s = max(v.lease_s for v in self.views.values()) + self.stale_s
                self._settle_pending(node, view, now)
            elif view is not None and view.agent_id == batch.agent_id:
                view.seen_s = max(view.seen_s, now) if fresh else view.seen_s
            return self._commands(node, now), changed

    def _settle_pending(self, node: str, view: NodeView, now: float) -> None:
        starts = self.starts.get(node, {})
        for key in list(starts):
            p = starts[key]
            if key in view.copies:
                del starts[key]
            elif p.sent_s is not None and now - p.sent_s > self.start_timeout_s:
                del starts[key]  # never arrived: the scheduler sees it vanished and requeues
        kills = self.kills.get(node, set())
        for key in list(kills):
            c = view.copies.get(key)
            if c is None or not c.running:
                kills.discard(key)
                self.stops.pop(key, None)

    def _commands(self, node: str, now: float) -> list[WireCommand]:
        out = [self._start_command(p, now) for p in self.starts.get(node, {}).values()]
        for job_id, gen in sorted(self.kills.get(node, set())):
            out.append(self._kill_command(job_id, gen))
        return out

    def _kill_command(self, job_id: str, generation: int) -> WireCommand:
        stop = self.stops.get((job_id, generation))
        if stop is None:
            return WireCommand(op="kill", job_id=job_id, generation=generation)
        return WireCommand(
            op="kill", job_id=job_id, generation=generation, signal=stop[0], grace_s=stop[1]
        )

    @staticmethod
    def _start_command(p: _PendingStart, now: float) -> WireCommand:
        if p.sent_s is None:
            p.sent_s = now
        la = p.launch
        return WireCommand(
            op="start",
            job_id=la.job_id,
            generation=la.generation,
            gpus=list(la.gpus),
            env=dict(la.env),
            spec=la.spec,
        )

    def _send_now(self, node: str, cmd: WireCommand) -> None:
        """Hand a new command to the control plane's outbox (outside ``_lock``)."""
        if self.deliver is not None:
            self.deliver(node, [cmd])

    # ----- JobExecutor -------------------------------------------------------------------------
    def _fresh(self, node: str) -> NodeView:
        view = self.views.get(node)
        if view is None or self.clock() - view.seen_s > self.stale_s:
            raise NodeUnreachable(f"node {node}: no recent jobs report from its agent")
        return view

    def start(self, launch: Launch) -> None:
        with self._lock:
            self._fresh(launch.node)
            key = (launch.job_id, launch.generation)
            p = _PendingStart(launch)
            self.starts.setdefault(launch.node, {})[key] = p
            self.kills.get(launch.node, set()).discard(key)
            cmd = self._start_command(p, self.clock()) if self.deliver else None
        if cmd is not None:
            self._send_now(launch.node, cmd)

    def kill(self, job_id: str, generation: int, node: str) -> bool:
        key = (job_id, generation)
        with self._lock:
            pending = self.starts.get(node, {})
            p = pending.pop(key, None)
            if p is not None and p.sent_s is None:
                return True  # never sent: nothing to kill
            view = self.views.get(node)
            known = view.copies.get(key) if view is not None else None
            fresh = view is not None and self.clock() - view.seen_s <= self.stale_s
            if fresh and p is None and (known is None or not known.running):
                return True  # the newest report shows it is not running
            new = key not in self.kills.get(node, set())
            self.kills.setdefault(node, set()).add(key)
        if new:
            self._send_now(node, self._kill_command(job_id, generation))
        return False  # the agent kills it on its next exchange (or when its lease ends)

    def signal_stop(
        self, job_id: str, generation: int, node: str, signal_name: str, grace_s: float
    ) -> bool:
        """A kill that is a checkpoint stop: the agent signals the copy and kills it after
        ``grace_s`` (`LocalProcessExecutor.signal_stop`). Raises ``NodeUnreachable`` when the
        node has not reported for ``stale_s``: the signal could not reach it."""
        key = (job_id, generation)
        with self._lock:
            self._fresh(node)
            self.stops[key] = (signal_name, grace_s)
        return self.kill(job_id, generation, node)

    def copy_gone(self, job_id: str, generation: int, node: str) -> bool:
        """Does the node's newest fresh report show this copy ended (or a never-sent start)?

        Only a report that lists the copy as not running counts: a copy missing from the report
        may be one the agent lost track of (the lease then decides). Raises
        ``NodeUnreachable`` when the node has not reported for ``stale_s``."""
        key = (job_id, generation)
        with self._lock:
            p = self.starts.get(node, {}).get(key)
            if p is not None:
                return p.sent_s is None  # a start still queued was never seen by the agent
            view = self._fresh(node)
            c = view.copies.get(key)
            return c is not None and not c.running

    def poll(self, node: str) -> list[CopyReport]:
        with self._lock:
            view = self._fresh(node)
            out = dict(view.copies)
            for key in self.starts.get(node, {}):
                out.setdefault(
                    key, CopyReport(key[0], key[1], node, True, None, "starting", confirmed=False)
                )
            for key in self.kills.get(node, set()):
                c = out.get(key)
                if c is not None and c.running:  # asked to die: not a live copy any more
                    out[key] = CopyReport(key[0], key[1], node, True, None, "being killed")
            return list(out.values())

    def fence(self, node: str, valid: Mapping[str, int]) -> list[CopyReport]:
        with self._lock:
            view = self._fresh(node)
            out = []
            for key, c in view.copies.items():
                if c.running and valid.get(key[0]) != key[1]:
                    self.kills.setdefault(node, set()).add(key)
                    out.append(c)
            starts = self.starts.get(node, {})
            for key in [k for k in starts if valid.get(k[0]) != k[1]]:
                del starts[key]
            return out

    def log_path(self, job_id: str, generation: int, node: str) -> Path | None:
        return None  # the log lives on the node; see ``log_text``

    def log_text(self, job_id: str, generation: int) -> str | None:
        """The newest output tail the node's agent sent for that copy."""
        with self._lock:
            return self.logs.get((job_id, generation))
