"""Fixtures for the dashboard tests: a real controller (uvicorn on loopback) fed by simulated
agents over HTTP, the SimFleet object itself (so a test can inject a fault), tokens for each
role, and a headless Debian `chromium` driven by Playwright (FAILS under CI when missing)."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpufleet.testing.testbed import free_port as free_port  # re-exported for the suites
from gpufleet.testing.timescale import scaled
from tests.serving import serve_app
from tests.waiting import wait_until

CHROMIUM = os.environ.get("GPUFLEET_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REPO = Path(__file__).resolve().parents[2]


def artifacts_dir() -> Path:
    """Where screenshots go: $GPUFLEET_ARTIFACTS, else test-artifacts/ at the repo root."""
    d = Path(os.environ.get("GPUFLEET_ARTIFACTS") or REPO / "test-artifacts")
    d.mkdir(parents=True, exist_ok=True)
    return d


def wait_for(pred: Callable[[], bool], timeout: float) -> bool:
    return wait_until(pred, timeout, step_s=0.1)


def chromium_or_fail() -> str:
    """The browser binary; under CI its absence is a failure, elsewhere a skip."""
    explicit = "GPUFLEET_CHROMIUM" in os.environ
    found = CHROMIUM if os.path.exists(CHROMIUM) else None
    if found is None and not explicit:
        found = shutil.which("chromium")
    if not found:
        if os.environ.get("CI"):
            pytest.fail(f"chromium (Debian package chromium) is required under CI: {CHROMIUM}")
        pytest.skip("chromium not found (apt-get install chromium)")
    try:
        import playwright  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("the playwright Python package is required under CI")
        pytest.skip("playwright not installed (pip install playwright)")
    return found


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Chromium for one test file. Not for the session: Playwright's sync API keeps an asyncio
    loop marked running in this thread while it is open, and a later file on the same xdist
    worker that calls ``asyncio.run`` would fail."""
    exe = chromium_or_fail()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS, timeout=60_000)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh browser context and page (1440x900, 15 s default timeout); the test fails if
    the page raised a JavaScript error."""
    ctx = browser.new_context(viewport={"width": 1440, "height": 900})
    pg = ctx.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.set_default_timeout(15_000)
    yield pg
    ctx.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


@dataclass
class LiveFleet:
    """A running controller with simulated agents pushing to it over loopback HTTP."""

    url: str
    service: Any
    sim: Any
    tokens: dict[str, str]
    stop: Callable[[], None]
    faulted: dict[str, float] = field(default_factory=dict)

    def dashboard(self, role: str, route: str = "") -> str:
        return f"{self.url}/#token={self.tokens[role]}{('&' + route) if route else ''}"

    def api(self, path: str, role: str = "admin") -> Any:
        import httpx

        r = httpx.get(
            f"{self.url}/api/v1{path}",
            headers={"Authorization": f"Bearer {self.tokens[role]}"},
            timeout=10,
        )
        r.raise_for_status()
        return r.json()


def start_fleet(tmp: Path, spec: str, *, racks_of: int = 16) -> LiveFleet:
    """Controller + uvicorn + one thread of simulated agents (sample 1 s, push 1 s)."""
    from gpufleet.agent.fleet import FleetConfig, FleetDriver
    from gpufleet.control.api.app import create_app
    from gpufleet.control.fleet import actions as act
    from gpufleet.control.service import ControlService, ServiceConfig
    from gpufleet.devices.discovery import open_sim

    svc = ControlService(ServiceConfig(data_dir=tmp / "data", max_pending=5000))
    svc.start()
    store = svc.store
    tokens = {
        role: store.tokens.create(role, name=f"web-{role}")[0]
        for role in ("admin", "operator", "viewer", "agent")
    }
    served = contextlib.ExitStack()
    port = served.enter_context(serve_app(create_app(svc), access_log=False))
    url = f"http://127.0.0.1:{port}"
    fleet = open_sim(spec, seed=7)
    fleet.sim.demo_activity()
    driver = FleetDriver(  # the real agent of every node
        fleet.backends,
        FleetConfig(
            controller=url,
            token=tokens["agent"],
            state_dir=tmp / "agents",
            fast_interval_s=1.0,
            push_interval_s=1.0,
            # lost after 3 x 5 s without a push: these fleets test pages, not liveness (the
            # ghost node of test_dashboard_lost declares its own 1 s), and 64 agents sharing a
            # worker process with the controller missed a 6 s bound on a loaded machine
            heartbeat_interval_s=scaled(5.0),
        ),
    ).start()
    names = [b.node_name for b in fleet.backends]
    if not wait_for(lambda: all(n in store.nodes for n in names), 60):
        raise RuntimeError("simulated nodes did not register")
    admin = store.tokens.resolve(tokens["admin"])
    assert admin is not None
    for i, n in enumerate(names):
        act.update_node(store, n, admin, rack=f"r{i // racks_of:02d}")

    def stop() -> None:
        driver.stop(flush=False)
        served.close()
        svc.stop()

    return LiveFleet(url=url, service=svc, sim=fleet.sim, tokens=tokens, stop=stop)


FleetStarter = Callable[[str, str], LiveFleet]


@pytest.fixture(scope="module")
def live_fleet(tmp_path_factory: pytest.TempPathFactory, browser: Any) -> Iterator[FleetStarter]:
    """``live_fleet(name, spec)``: `start_fleet` of ``spec`` in a fresh temporary directory
    ``name``, for one test file (browser first, so a missing chromium stops early); each fleet
    it started is stopped at the end of the file."""
    _ = browser
    started: list[LiveFleet] = []

    def start(name: str, spec: str) -> LiveFleet:
        started.append(start_fleet(tmp_path_factory.mktemp(name), spec))
        return started[-1]

    try:
        yield start
    finally:
        for f in started:
            f.stop()


@pytest.fixture(scope="module")
def fleet64(live_fleet: FleetStarter) -> LiveFleet:
    """64 simulated nodes x 8 H100."""
    return live_fleet("web", "64x8xh100-sxm")
