"""One hung receiver silences none of the others (issue 29): each receiver has its own lane.
Before, one worker served every sink, so a webhook that hung 10 s a try let 4 of 60
notifications reach a healthy receiver in 100 s and then the shared queue overflowed."""

from __future__ import annotations

import threading
from functools import partial

from gpufleet.control.notify.config import RetryConfig
from gpufleet.control.notify.notification import Notification
from gpufleet.control.notify.notifier import Notifier
from tests.waiting import wait_until


def note(i: int) -> Notification:
    return Notification(
        id=f"lane-{i}",
        kind="node_state",
        at_s=1_700_000_000.0,
        summary="in_service -> lost: heartbeats stopped",
        severity=2,
        node="gpu-07",
        data={"from": "in_service", "to": "lost"},
    )


class Hung:
    """A receiver whose every attempt blocks until the test lets it go (a webhook that hangs)."""

    name = "webhook http://hung.example:80"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.got: list[str] = []

    def wants(self, n: Notification) -> bool:
        return True

    def deliver(self, n: Notification, attempt: int) -> None:
        self.entered.set()
        self.release.wait(30)
        self.got.append(n.id)


class Healthy:
    name = "webhook http://healthy.example:80"

    def __init__(self) -> None:
        self.got: list[str] = []

    def wants(self, n: Notification) -> bool:
        return True

    def deliver(self, n: Notification, attempt: int) -> None:
        self.got.append(n.id)

    def has(self, count: int) -> bool:
        return len(self.got) == count


def test_a_hung_receiver_delays_and_drops_only_its_own_notifications() -> None:
    hung, healthy = Hung(), Healthy()
    notifier = Notifier([hung, healthy], retry=RetryConfig(attempts=2), queue_size=5).start()
    try:
        results = []
        for i in range(60):  # each reaches the healthy receiver while the hung one holds its first
            results.append(notifier.publish(note(i)))
            assert wait_until(partial(healthy.has, i + 1), 30), f"{i}: {healthy.got}"
        assert healthy.got == [f"lane-{i}" for i in range(60)]
        assert hung.entered.is_set() and hung.got == []
        rx = notifier.receivers()
        assert rx[healthy.name]["delivered"] == 60 and rx[healthy.name]["dropped"] == 0
        # The hung lane kept what its bound holds (one in flight + 5 queued) and counted the
        # rest as its own drops; each drop made publish say False.
        assert rx[hung.name]["dropped"] == 60 - 6 == results.count(False)
        assert rx[hung.name]["waiting"] == 5
        assert notifier.stats["dropped"] == 54 and notifier.stats["delivered"] == 60
        hung.release.set()
        assert notifier.flush(30)
        assert hung.got == [f"lane-{i}" for i in range(6)]
        assert notifier.receivers()[hung.name]["delivered"] == 6
    finally:
        hung.release.set()
        notifier.stop(timeout_s=5)
