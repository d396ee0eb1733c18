"""The test tiers: a test is *fast* unless marked ``process`` or ``browser``, and this plugin
holds fast tests to that.

While a fast test runs (its setup, call and teardown), starting a process by any route
(``subprocess``, ``os.fork``/``forkpty``, ``os.posix_spawn[p]``, ``os.system``, a
``multiprocessing`` process, an asyncio subprocess, anything that reaches
``_posixsubprocess.fork_exec``) or listening on a socket raises `FastTierViolation` at the call
and fails the test with the route named, whether or not the code under test swallows the error.
Calls from threads that were already running when the test began (a module rig of an earlier
``process`` test) are not the test's own and pass.

``GPUFLEET_TIER_AUDIT=FILE`` records each violation (``nodeid<TAB>route``) to FILE instead of
failing: how the marks were first placed, and how to find a test that needs one.
"""

from __future__ import annotations

import _posixsubprocess
import asyncio
import asyncio.base_events
import asyncio.unix_events
import contextlib
import multiprocessing.process
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import pluggy
import pytest

# The marks that take a test out of the fast tier (registered in pyproject.toml).
SLOW_TIERS = ("process", "browser")


class FastTierViolation(RuntimeError):
    """A fast-tier test tried to start a process or listen on a socket."""


def listening_sockets() -> set[int]:
    """The inodes of this process's listening sockets (TCP, TCP6 and Unix), from /proc: what a
    listener made below Python (uvloop, a C extension) leaves behind."""
    mine = set()
    try:
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/self/fd/{fd}")
                if link.startswith("socket:["):
                    mine.add(int(link[8:-1]))
    except OSError:
        return set()
    listening = set()
    for table, col, value in (("tcp", 3, "0A"), ("tcp6", 3, "0A"), ("unix", 3, "00010000")):
        with contextlib.suppress(OSError), open(f"/proc/net/{table}", encoding="ascii") as f:
            for line in f.readlines()[1:]:
                cells = line.split()
                inode_col = 9 if table != "unix" else 6
                if len(cells) > inode_col and cells[col] == value:
                    listening.add(int(cells[inode_col]))
    return mine & listening


def child_processes() -> set[int]:
    """The pids of this process's children (any thread's), from /proc."""
    out: set[int] = set()
    with contextlib.suppress(OSError):
        for task in os.listdir("/proc/self/task"):
            with contextlib.suppress(OSError), open(f"/proc/self/task/{task}/children") as f:
                out.update(int(pid) for pid in f.read().split())
    return out


@dataclass
class _Scope:
    """One running test: whether it is held to the fast tier, and what it tried."""

    nodeid: str
    enforce: bool
    threads: frozenset[int]
    tearing_down: bool = False  # module and session fixtures end in a test's teardown
    listeners: set[int] = field(default_factory=set)
    children: set[int] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)


class TierGuard:
    """The patched entry points and the stack of running tests (nested pytester runs push)."""

    def __init__(self) -> None:
        self.stack: list[_Scope] = []
        self.audit_path = os.environ.get("GPUFLEET_TIER_AUDIT") or None
        self.installed = False
        self._main = threading.main_thread().ident

    # -- scopes -------------------------------------------------------------------------------
    def begin(self, nodeid: str, enforce: bool) -> _Scope:
        others = {t.ident for t in threading.enumerate() if t.ident is not None}
        others.discard(self._main)
        scope = _Scope(nodeid, enforce, frozenset(others))
        if enforce:
            scope.listeners, scope.children = listening_sockets(), child_processes()
        self.stack.append(scope)
        return scope

    def sweep(self) -> None:
        """Record what the current test left that no patched call saw: a listening socket or a
        child process that was not there when it began."""
        if not self.stack or not self.stack[-1].enforce:
            return
        scope = self.stack[-1]
        listeners, children = listening_sockets(), child_processes()
        if listeners - scope.listeners:
            self._record(scope, "a listening socket (made below Python, e.g. uvloop)")
        if children - scope.children:
            self._record(scope, "a child process (started below Python)")
        scope.listeners |= listeners
        scope.children |= children

    def end(self, scope: _Scope) -> None:
        if scope in self.stack:
            self.stack.remove(scope)

    def take(self) -> list[str]:
        """The violations recorded since the last call, for the current test."""
        if not self.stack:
            return []
        out, self.stack[-1].violations[:] = list(self.stack[-1].violations), []
        return out

    def check(self, route: str) -> None:
        """Called by every patched entry point before it acts."""
        if not self.stack:
            return
        scope = self.stack[-1]
        if not scope.enforce or scope.tearing_down or threading.get_ident() in scope.threads:
            return
        if self._record(scope, route):
            return
        raise FastTierViolation(
            f"{route} in a fast-tier test: mark it @pytest.mark.process (or browser)"
        )

    def _record(self, scope: _Scope, route: str) -> bool:
        """Note a violation; True when only recording (``GPUFLEET_TIER_AUDIT``)."""
        scope.violations.append(route)
        if self.audit_path is None:
            return False
        with open(self.audit_path, "a", encoding="utf-8") as f:
            f.write(f"{scope.nodeid}\t{route}\n")
        return True

    # -- patches ------------------------------------------------------------------------------
    def install(self) -> None:
        if self.installed:
            return
        self.installed = True
        self._wrap(_posixsubprocess, "fork_exec", "subprocess (fork_exec)")
        self._wrap(subprocess.Popen, "_execute_child", "subprocess.Popen")
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system"):
            if hasattr(os, name):
                self._wrap(os, name, f"os.{name}")
        self._wrap(multiprocessing.process.BaseProcess, "start", "multiprocessing Process.start")
        self._wrap(socket.socket, "listen", "socket.listen")
        self._wrap(asyncio.base_events.BaseEventLoop, "create_server", "asyncio create_server")
        self._wrap(asyncio.unix_events.SelectorEventLoop, "create_unix_server", "asyncio server")
        try:
            import uvloop  # uvicorn's loop: listens in libuv, never through socket.listen
        except ImportError:
            return
        for name in ("create_server", "create_unix_server"):
            self._wrap(uvloop.Loop, name, f"uvloop {name}")

    def _wrap(self, owner: Any, name: str, route: str) -> None:
        original: Callable[..., Any] = getattr(owner, name)
        guard = self

        def guarded(*args: Any, **kwargs: Any) -> Any:
            guard.check(route)
            return original(*args, **kwargs)

        guarded.__wrapped__ = original  # type: ignore[attr-defined]
        guarded.__name__ = getattr(original, "__name__", name)
        setattr(owner, name, guarded)


GUARD = TierGuard()


# Fixtures that start a daemon: a test that uses one is in that tier whether or not it says so.
TIER_OF_FIXTURE = {
    "browser": "browser",  # headless Chromium (tests/web/conftest.py)
    "pg_url": "process",  # a PostgreSQL server (tests/control/conftest.py)
}


def mark_by_fixtures(items: list[pytest.Item]) -> None:
    """Add the tier mark of every `TIER_OF_FIXTURE` fixture an item uses."""
    for item in items:
        for name in getattr(item, "fixturenames", ()):
            tier = TIER_OF_FIXTURE.get(name)
            if tier is not None:
                item.add_marker(getattr(pytest.mark, tier))


def is_fast(item: pytest.Item) -> bool:
    """Whether ``item`` belongs to the fast tier (none of `SLOW_TIERS`' marks)."""
    return not any(item.get_closest_marker(m) is not None for m in SLOW_TIERS)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    GUARD.install()
    scope = GUARD.begin(item.nodeid, enforce=is_fast(item))
    try:
        yield
    finally:
        GUARD.end(scope)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
    """A fast test's teardown may stop what wider fixtures started (the session's PostgreSQL
    server ends in the teardown of whichever test runs last): calls are not held to the tier
    there; what the teardown leaves running is still swept."""
    if GUARD.stack:
        GUARD.stack[-1].tearing_down = True
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pluggy.Result[pytest.TestReport]]:
    outcome = yield
    GUARD.sweep()
    tried = GUARD.take()
    if not tried or GUARD.audit_path is not None:
        return
    report = outcome.get_result()
    routes = ", ".join(sorted(set(tried)))
    why = (
        f"{item.nodeid}: a fast-tier test started a process or listened on a socket "
        f"({routes}) during {call.when}; mark it @pytest.mark.process "
        "(or browser) or keep it in-process"
    )
    if report.failed:  # keep the traceback: it shows where the process was started
        report.sections.append(("fast tier", why))
    else:  # the code under test swallowed the error: fail all the same
        report.outcome = "failed"
        report.longrepr = why
