"""The campaign planner: which node to update when, inside maintenance windows, never taking
in-service GPU capacity below the floor, never more than a batch at once, never more than N
nodes of one failure domain (rack or leaf switch) at once.

The plan is a discrete-event simulation over the expected per-node duration (drain, update,
reboot, verify, validate). It is greedy and deterministic: nodes already out of service
first (updating them costs no capacity), then round-robin across failure domains so that
consecutive starts land in different racks. A node starts only when its whole expected
duration fits in the current window (a node is never planned to sit drained across the week);
the running campaign, which sees real durations, lets a step in flight finish when a window
closes and starts no new node.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import zip_longest

from gpufleet.errors import UsageError
from gpufleet.maintenance.windows import Schedule

# Expected validation time per level, from DCGM's diagnostic run levels (r1 "quick, seconds",
# r2 "medium, about 2 minutes", r3 "long, about 30 minutes"), rounded up:
# https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html
VALIDATE_S = {0: 0.0, 1: 60.0, 2: 180.0, 3: 1800.0}


@dataclass(frozen=True)
class StepDurations:
    """Expected seconds per step of one node (site-specific; flags override each)."""

    drain_s: float = 900.0  # jobs finish or checkpoint and requeue by this deadline
    update_s: float = 1200.0  # the site's update command
    reboot_s: float = 600.0  # node back and agent registered
    verify_s: float = 60.0  # versions read back against the baseline
    validate_level: int = 2

    @property
    def validate_s(self) -> float:
        return VALIDATE_S[self.validate_level]

    @property
    def total_s(self) -> float:
        return self.drain_s + self.update_s + self.reboot_s + self.verify_s + self.validate_s


@dataclass(frozen=True)
class CampaignNode:
    """A node of the fleet as the planner sees it."""

    name: str
    gpus: int
    domain: str  # failure domain: its rack, leaf switch, or its own name when unknown
    in_service: bool = True
    selected: bool = True  # part of the campaign (others only count toward capacity)


@dataclass(frozen=True)
class PlanLimits:
    """How much may be out at once."""

    batch: int  # nodes updating at once
    floor: float  # fraction of the fleet's GPUs that stays in service, 0..1
    per_domain: int = 1  # nodes of one failure domain at once
    fit_window: bool = True


@dataclass(frozen=True)
class PlannedNode:
    """One node's slot in the plan."""

    name: str
    domain: str
    order: int
    start: datetime
    end: datetime


@dataclass(frozen=True)
class TimelinePoint:
    """In-service capacity and nodes in maintenance from ``t`` on."""

    t: datetime
    in_service: float  # fraction of the fleet's GPUs
    updating: int


@dataclass
class CampaignPlan:
    """The planned campaign and its figures."""

    nodes: list[PlannedNode]
    timeline: list[TimelinePoint]
    start: datetime
    end: datetime
    parallelism: int  # the most nodes the limits allow at once
    min_in_service: float
    ideal_s: float  # sum of per-node durations / parallelism (no windows)
    serial_s: float | None  # one node at a time inside the same windows (wall clock)
    windows_used: int
    unplannable: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return (self.end - self.start).total_seconds()


def batch_size(value: str, fleet_nodes: int) -> int:
    """``5%`` of the fleet's nodes (at least 1) or a count."""
    from gpufleet.errors import UsageError

    text = value.strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 < pct <= 100:
                raise ValueError
            return max(1, math.floor(fleet_nodes * pct / 100))
        n = int(text)
        if n < 1:
            raise ValueError
        return n
    except ValueError:
        raise UsageError(
            f"--batch {value!r}: expected a node count >= 1 or a percentage such as 5%"
        ) from None


def fraction(value: str, option: str) -> float:
    """``90%`` or ``0.9`` as 0.9."""
    from gpufleet.errors import UsageError

    text = value.strip()
    try:
        f = float(text[:-1]) / 100 if text.endswith("%") else float(text)
        if not 0 <= f <= 1:
            raise ValueError
        return f
    except ValueError:
        raise UsageError(
            f"{option} {value!r}: expected a percentage 0-100% or a fraction 0-1"
        ) from None


def campaign_order(nodes: list[CampaignNode]) -> list[CampaignNode]:
    """Out-of-service nodes first, then round-robin across failure domains (domains and the
    nodes within each in name order)."""
    chosen = [n for n in nodes if n.selected]
    first = sorted((n for n in chosen if not n.in_service), key=lambda n: n.name)
    by_domain: dict[str, list[CampaignNode]] = defaultdict(list)
    for n in sorted((n for n in chosen if n.in_service), key=lambda n: n.name):
        by_domain[n.domain].append(n)
    rounds = zip_longest(*(by_domain[d] for d in sorted(by_domain)))
    return first + [n for r in rounds for n in r if n is not None]


def _longest_window_s(schedule: Schedule, start: datetime) -> float:
    if schedule.always:
        return math.inf
    spans = schedule.intervals(start)
    return max(((b - a).total_seconds() for a, b in spans), default=0.0)


def plan_campaign(
    nodes: list[CampaignNode],
    limits: PlanLimits,
    schedule: Schedule,
    durations: StepDurations,
    start: datetime,
    *,
    with_serial: bool = True,
) -> CampaignPlan:
    """The campaign over ``nodes`` (every node of the fleet; ``selected`` ones are updated)."""
    start = start.astimezone(UTC)
    total = sum(n.gpus for n in nodes) or 1
    out0 = sum(n.gpus for n in nodes if not n.in_service)
    spare = total * (1 - limits.floor) - out0  # GPUs that may still go out
    per_node_s = durations.total_s
    longest = _longest_window_s(schedule, start)
    unplannable: list[tuple[str, str]] = []
    queue: list[CampaignNode] = []
    for n in campaign_order(nodes):
        if n.in_service and n.gpus > spare + 1e-9:
            unplannable.append(
                (n.name, f"taking its {n.gpus} GPUs out would put the fleet below the floor")
            )
        elif limits.fit_window and per_node_s > longest:
            unplannable.append((n.name, f"its {per_node_s / 3600:.1f} h do not fit in any window"))
        else:
            queue.append(n)
    in_domains = {n.domain for n in queue}
    parallelism = min(limits.batch, limits.per_domain * max(1, len(in_domains)), len(queue))
    planned, timeline, end, windows = _simulate(
        queue, limits, schedule, per_node_s, start, total, out0
    )
    notes = []
    if not queue:
        notes.append("nothing to update")
    serial_s = None
    if with_serial and queue:
        one = PlanLimits(batch=1, floor=limits.floor, per_domain=1, fit_window=limits.fit_window)
        _, _, s_end, _ = _simulate(queue, one, schedule, per_node_s, start, total, out0)
        serial_s = (s_end - start).total_seconds()
    return CampaignPlan(
        nodes=planned,
        timeline=timeline,
        start=start,
        end=end,
        parallelism=parallelism,
        min_in_service=min(p.in_service for p in timeline),
        ideal_s=len(queue) * per_node_s / max(1, parallelism),
        serial_s=serial_s,
        windows_used=windows,
        unplannable=unplannable,
        notes=notes,
    )


def _simulate(
    queue: list[CampaignNode],
    limits: PlanLimits,
    schedule: Schedule,
    per_node_s: float,
    start: datetime,
    total: int,
    out0: int,
) -> tuple[list[PlannedNode], list[TimelinePoint], datetime, int]:
    pending = list(queue)
    running: list[tuple[datetime, int, CampaignNode]] = []
    in_domain: dict[str, int] = defaultdict(int)
    in_service = total - out0
    planned: list[PlannedNode] = []
    t = schedule.next_open(start)
    timeline = [TimelinePoint(start, in_service / total, 0)]
    windows: set[datetime] = set()
    duration = timedelta(seconds=per_node_s)
    floor_gpus = limits.floor * total - 1e-9
    seq = 0
    while pending or running:
        close = schedule.open_until(t)
        if close is not None:
            for n in list(pending):
                if len(running) >= limits.batch:
                    break
                if in_domain[n.domain] >= limits.per_domain:
                    continue
                if n.in_service and in_service - n.gpus < floor_gpus:
                    continue
                if limits.fit_window and t + duration > close:
                    continue
                pending.remove(n)
                in_domain[n.domain] += 1
                if n.in_service:
                    in_service -= n.gpus
                heapq.heappush(running, (t + duration, seq, n))
                planned.append(PlannedNode(n.name, n.domain, len(planned) + 1, t, t + duration))
                windows.add(close)
                seq += 1
            timeline.append(TimelinePoint(t, in_service / total, len(running)))
        nexts = [running[0][0]] if running else []
        if pending and not running:
            nexts.append(schedule.next_open(t) if close is None else schedule.next_open(close))
        elif pending and close is None:
            nexts.append(schedule.next_open(t))
        t = min(nexts)
        while running and running[0][0] <= t:
            _, _, n = heapq.heappop(running)
            in_domain[n.domain] -= 1
            if n.in_service:  # back after validation; a node that was out stays out
                in_service += n.gpus
        timeline.append(TimelinePoint(t, in_service / total, len(running)))
    end = max((p.end for p in planned), default=start)
    return planned, _compact(timeline), end, len(windows)


def _compact(points: list[TimelinePoint]) -> list[TimelinePoint]:
    """One point per instant (the last), dropping points that change nothing."""
    out: list[TimelinePoint] = []
    for p in points:
        if out and out[-1].t == p.t:
            out[-1] = p
        elif not out or (out[-1].in_service, out[-1].updating) != (p.in_service, p.updating):
            out.append(p)
    return out


SELECT_KEYS = ("node", "model", "rack")


def parse_select(text: str | None) -> list[tuple[str, str]]:
    """``model=h100-sxm,rack=r0*`` as [(key, glob), ...]; a clear error for a bad key."""
    if not text:
        return []
    out = []
    for part in text.split(","):
        key, eq, glob = part.strip().partition("=")
        if not eq or key not in SELECT_KEYS or not glob:
            raise UsageError(
                f"--select {text!r}: {part!r} should be KEY=GLOB with KEY one of "
                f"{', '.join(SELECT_KEYS)} (e.g. model=h100-sxm,rack=r0*)"
            )
        out.append((key, glob))
    return out
