"""``SimExecutor``: simulated node agents running simulated jobs on a ``SimFleet``.

A copy loads its simulated GPUs (``SimGpu.run(Load(...), duration_s=...)``) from its start for
``spec.duration_s`` seconds of the fleet's clock and then exits 0. A copy whose GPU falls off the
bus (``FaultKind.FALLEN_OFF_BUS``, XID 79) dies with exit code 1 and ``node_fault=True``.

Node failures for tests and benchmarks:
- ``crash(node)``: the machine dies; its copies stop at once; the agent is unreachable.
- ``partition(node)``: the agent is cut off but alive; its copies keep running until the agent's
  lease (``lease_s`` after its last contact with the scheduler) runs out, then it kills them.
- ``restore(node)``: the agent answers again (after a crash it knows no copies).

Every copy's run interval is recorded in ``intervals`` so tests can check that no job ever ran
twice at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.devices.sim import FaultKind, Load, SimFleet
from gpufleet.schedulers.embedded.executor import (
    CopyReport,
    ExecutorError,
    Launch,
    NodeUnreachable,
)

DEFAULT_LOAD = Load(util=1.0, intensity=1.0, kind="bf16_matmul", fb_used_bytes=40 * 2**30)


@dataclass
class _Copy:
    launch: Launch
    start_s: float
    end_s: float | None  # planned end (None: runs until killed)
    stopped_s: float | None = None
    exit_code: int | None = None
    reason: str = ""
    node_fault: bool = False


@dataclass(frozen=True)
class Interval:
    """One copy of a job ran on ``node`` from ``start_s`` to ``end_s``."""

    job_id: str
    generation: int
    node: str
    start_s: float
    end_s: float
    how: str


@dataclass
class SimExecutor:
    """Simulated agents for every node of a ``SimFleet`` (one clock for all)."""

    fleet: SimFleet
    lease_s: float = 5.0
    confirms_starts = False  # a simulated copy runs when ``start`` returns
    load: Load = DEFAULT_LOAD
    clock: Callable[[], float] | None = None
    copies: dict[tuple[str, int, str], _Copy] = field(default_factory=dict)
    intervals: list[Interval] = field(default_factory=list)
    down: set[str] = field(default_factory=set)  # crashed: no agent
    cut: set[str] = field(default_factory=set)  # partitioned: agent alive, unreachable
    last_contact: dict[str, float] = field(default_factory=dict)
    highest: dict[tuple[str, str], int] = field(default_factory=dict)  # (node, job) -> generation

    def now(self) -> float:
        return (self.clock or self.fleet.clock)()

    # ----- failures ------------------------------------------------------------------------
    def crash(self, node: str) -> None:
        self.advance()
        now = self.now()
        for key, c in self.copies.items():
            if key[2] == node and c.stopped_s is None:
                self._stop(c, now, None, "node crashed")
        self.down.add(node)

    def partition(self, node: str) -> None:
        self.advance()
        self.cut.add(node)

    def restore(self, node: str) -> None:
        self.advance()
        if node in self.down:
            self.down.discard(node)
            self.highest = {k: v for k, v in self.highest.items() if k[0] != node}
            self.copies = {k: c for k, c in self.copies.items() if k[2] != node}
        self.cut.discard(node)
        self.last_contact[node] = self.now()

    # ----- time ----------------------------------------------------------------------------
    def _stop(
        self, c: _Copy, at: float, code: int | None, reason: str, fault: bool = False
    ) -> None:
        c.stopped_s, c.exit_code, c.reason, c.node_fault = at, code, reason, fault
        node = self.fleet.node(c.launch.node)
        for i in c.launch.gpus:
            node.gpus[i].stop(at_s=at)
        la = c.launch
        self.intervals.append(Interval(la.job_id, la.generation, la.node, c.start_s, at, reason))

    def advance(self) -> None:
        """Bring every copy up to now: finish, die of a GPU fault, or self-fence."""
        now = self.now()
        for key, c in sorted(self.copies.items(), key=lambda kv: kv[1].start_s):
            if c.stopped_s is not None:
                continue
            node = key[2]
            if node in self.cut:
                deadline = self.last_contact.get(node, c.start_s) + self.lease_s
                if deadline <= now and (c.end_s is None or deadline < c.end_s):
                    self._stop(c, max(deadline, c.start_s), None, "agent lease expired")
                    continue
            gpus = self.fleet.node(node).gpus
            lost = [i for i in c.launch.gpus if gpus[i].has_fault(FaultKind.FALLEN_OFF_BUS, now)]
            if lost:
                self._stop(c, now, 1, f"GPU {lost[0]} fell off the bus (XID 79)", True)
            elif c.end_s is not None and c.end_s <= now:
                self._stop(c, c.end_s, 0, "completed")

    def _contact(self, node: str) -> None:
        self.fleet.node(node)  # unknown node: a clear error
        if node in self.down or node in self.cut:
            raise NodeUnreachable(f"node {node}: agent unreachable")
        self.last_contact[node] = self.now()

    # ----- JobExecutor ---------------------------------------------------------------------
    def start(self, launch: Launch) -> None:
        self.advance()
        self._contact(launch.node)
        hkey = (launch.node, launch.job_id)
        if self.highest.get(hkey, -1) > launch.generation:
            raise ExecutorError(f"job {launch.job_id}: generation {launch.generation} is stale")
        self.highest[hkey] = launch.generation
        now = self.now()
        for key, c in self.copies.items():  # an older copy of this job here: fence it
            if key[0] == launch.job_id and key[2] == launch.node and c.stopped_s is None:
                self._stop(c, now, None, "fenced by a newer generation")
        node = self.fleet.node(launch.node)
        bad = [i for i in launch.gpus if not 0 <= i < len(node.gpus)]
        if bad:
            raise ExecutorError(f"node {launch.node}: no GPU {bad[0]}")
        duration = launch.spec.duration_s
        for i in launch.gpus:
            node.gpus[i].run(self.load, start_s=now, duration_s=duration)
        end = None if duration is None else now + duration
        self.copies[(launch.job_id, launch.generation, launch.node)] = _Copy(launch, now, end)

    def kill(self, job_id: str, generation: int, node: str) -> bool:
        self.advance()
        c = self.copies.get((job_id, generation, node))
        if c is None or c.stopped_s is not None:
            # Nothing running that we know of; a cut-off agent might still run it.
            return node not in self.cut
        try:
            self._contact(node)
        except NodeUnreachable:
            return False
        self._stop(c, self.now(), None, "killed")
        return True

    def signal_stop(
        self, job_id: str, generation: int, node: str, signal_name: str, grace_s: float
    ) -> bool:
        """A simulated job checkpoints at once: the stop is a kill."""
        return self.kill(job_id, generation, node)

    def poll(self, node: str) -> list[CopyReport]:
        self.advance()
        self._contact(node)
        return [
            CopyReport(k[0], k[1], k[2], c.stopped_s is None, c.exit_code, c.reason, c.node_fault)
            for k, c in self.copies.items()
            if k[2] == node
        ]

    def fence(self, node: str, valid: Mapping[str, int]) -> list[CopyReport]:
        self.advance()
        self._contact(node)
        out = []
        now = self.now()
        for k, c in self.copies.items():
            if k[2] == node and c.stopped_s is None and valid.get(k[0]) != k[1]:
                self._stop(c, now, None, "fenced")
                out.append(CopyReport(k[0], k[1], k[2], False, None, "fenced"))
        return out

    def log_path(self, job_id: str, generation: int, node: str) -> Path | None:
        return None
