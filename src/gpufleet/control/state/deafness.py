"""The controller's own deaf time: spans in which its event loop could not hear agents.

A node is declared lost after ``lost_after_intervals`` heartbeat intervals of silence. When the
controller itself is starved of CPU (a loaded machine: its event loop runs seconds late, the
agents' pushes wait unread in their sockets), every node looks silent at once although none
is: on a 2-core machine running the test suite, a restarted controller declared two pushing
agents lost together. A pulse on the event loop (`pulse`) wakes every ``PULSE_S``; however late
a wake comes (beyond ``JITTER_S``), that lateness is deaf time (`DeafTime`): a loop that runs at
half speed hears half the time, a stopped one none. The lost rule counts only the silence the
controller could have heard (`DeafTime.heard`): on a quiet machine that is all of it (a few
milliseconds a second short), on a starved one a node goes lost later, never falsely. A real
outage of the node is still declared after its intervals of the controller's listening time.

`PulseMiddleware` starts the pulse on the loop that serves the app, at its first request (it
works whether or not the server runs the ASGI lifespan).
"""

from __future__ import annotations

import asyncio
import bisect
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

PULSE_S = 0.1  # how often the pulse wakes
JITTER_S = 0.01  # a wake later than this counts its lateness as deaf (a quiet loop: ~1 ms)
KEEP_S = 3600.0  # deaf spans older than this are forgotten (longer than any lost limit)


class DeafTime:
    """Spans ``(start, end)`` of the store's clock in which the controller could not hear."""

    def __init__(self) -> None:
        self._starts: list[float] = []
        self._ends: list[float] = []
        self._lock = threading.Lock()

    def add(self, start: float, end: float) -> None:
        """Record a deaf span; spans that overlap are merged (the event loop's pulse and the
        control loop may both see the same stall)."""
        if end <= start:
            return
        with self._lock:
            i = bisect.bisect_left(self._ends, start)  # the first span ending at or after start
            j = bisect.bisect_right(self._starts, end)  # past the last span starting by end
            if i < j:  # spans i..j-1 overlap [start, end]: one span covers them all
                start = min(start, self._starts[i])
                end = max(end, self._ends[j - 1])
            self._starts[i:j] = [start]
            self._ends[i:j] = [end]
            cut = bisect.bisect_left(self._ends, self._ends[-1] - KEEP_S)
            if cut > 256:  # forget in bulk: a pulse adds a span for every late wake
                del self._starts[:cut], self._ends[:cut]

    def within(self, a: float, b: float) -> float:
        """Seconds of deaf time between ``a`` and ``b``."""
        if b <= a:
            return 0.0
        with self._lock:
            first = bisect.bisect_right(self._ends, a)
            total = 0.0
            for start, end in zip(self._starts[first:], self._ends[first:], strict=True):
                if start >= b:
                    break
                total += min(end, b) - max(start, a)
            return total

    def heard(self, since: float, now: float) -> float:
        """Of the time from ``since`` to ``now``, the seconds the controller could hear."""
        return max(0.0, now - since - self.within(since, now))


class DatabaseOutage:
    """Deaf time while the database is away. The controller then answers every push 503 (not
    acknowledged, nothing stored), so a node's silence over that span is the controller's, not
    the node's: counted as deaf (`DeafTime`), an outage longer than a node's lost threshold but
    shorter than the leader's lease (no takeover, so no grace) does not declare the pushing
    nodes lost on the first pass after the database is back (issue 29). The writer reports
    every operation that failed with the database away (`failed`) and every group commit that
    stored (`ok`: one surely reached the database, where a command may have read only the
    cache); the span runs from the last success before the first failure (at most `LOOKBACK_S`
    earlier: a quiet controller's last write may be old) and grows with every failure, so a
    lost check that runs before any push is stored again already sees it."""

    LOOKBACK_S = 5.0

    def __init__(self, deaf: DeafTime, clock: Callable[[], float]) -> None:
        self.deaf = deaf
        self.clock = clock
        self._lock = threading.Lock()
        self._ok_s: float | None = None
        self._since: float | None = None

    @property
    def away(self) -> bool:
        """Whether the last database operation failed with the database away."""
        return self._since is not None

    def failed(self) -> None:
        """A database operation failed because the database is away."""
        now = self.clock()
        with self._lock:
            if self._since is None:
                ok = self._ok_s
                self._since = now if ok is None else max(ok, now - self.LOOKBACK_S)
            self.deaf.add(self._since, now)

    def ok(self) -> None:
        """A database operation succeeded: an outage, if one ran, ends now."""
        now = self.clock()
        with self._lock:
            if self._since is not None:
                self.deaf.add(self._since, now)
                self._since = None
            self._ok_s = now


async def pulse(deaf: DeafTime, clock: Callable[[], float], every_s: float = PULSE_S) -> None:
    """Wake every ``every_s`` on the running loop and record each late wake as deaf time."""
    while True:
        before = time.monotonic()
        await asyncio.sleep(every_s)
        late = time.monotonic() - before - every_s
        if late > JITTER_S:
            now = clock()
            deaf.add(now - late, now)


class PulseMiddleware:
    """ASGI middleware: starts `pulse` on the loop that serves the app, at its first call."""

    def __init__(self, app: Any, deaf: DeafTime, clock: Callable[[], float]) -> None:
        self.app = app
        self.deaf = deaf
        self.clock = clock
        self._loops: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary()
        )

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        loop = asyncio.get_running_loop()
        if loop not in self._loops:
            self._loops[loop] = loop.create_task(pulse(self.deaf, self.clock))
        await self.app(scope, receive, send)
