"""Fixtures for the control-plane tests: services on SQLite (always) and on a private
PostgreSQL server (Debian's `postgresql` package; FAILS under CI when missing), a manual clock,
and a builder of wire batches from the simulator."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.control.state.remediation import RemediationPolicy
from gpufleet.devices.sim import ManualClock
from gpufleet.testing.testbed import free_port as free_port  # re-exported for the suites
from tests.waiting import wait_until

T0 = 1_700_000_000.0


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


class PgServer:
    """A private PostgreSQL server on a loopback port, as the `postgres` user, in its own
    temporary directory: ``start``/``stop`` it (a test may take it away and bring it back)."""

    def __init__(self) -> None:
        bindir = _pg_bin()
        if bindir is None or shutil.which("runuser") is None:
            if os.environ.get("CI"):
                pytest.fail("PostgreSQL (Debian package postgresql) is required under CI")
            pytest.skip("PostgreSQL binaries not found (apt-get install postgresql)")
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="gpufleet-pg-"))
        os.chmod(self.root, 0o777)
        self.data = self.root / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres")

    def _run(self, tool: str, *args: str, check: bool = True) -> None:
        as_pg = ["runuser", "-u", "postgres", "--", str(self.bindir / tool)]
        subprocess.run([*as_pg, *args], check=check, capture_output=True, timeout=120)

    def start(self, options: str = "") -> None:
        """Start it (``options``: more ``-c name=value`` server settings)."""
        opts = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=on {options}"
        log = str(self.root / "log")
        self._run("pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-l", log, "-o", opts, "start")

    def stop(self, mode: str = "fast", *, check: bool = True) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop", check=check)

    def remove(self) -> None:
        self.stop("immediate", check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """The session's private PostgreSQL server (`PgServer`)."""
    server = PgServer()
    try:
        server.start()
        yield server.url
    finally:
        server.remove()


@pytest.fixture
def own_pg() -> Iterator[PgServer]:
    """A PostgreSQL server of the test's own, started (the test may stop and start it), removed
    afterwards."""
    pg = PgServer()
    try:
        pg.start()
        yield pg
    finally:
        pg.remove()


def _reset_pg(url: str) -> None:
    from sqlalchemy import create_engine, text

    eng = create_engine(url)
    with eng.begin() as c:
        c.execute(text("DROP SCHEMA public CASCADE"))
        c.execute(text("CREATE SCHEMA public"))
    eng.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.process)])
def db_config(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """Storage tests run on both databases."""
    if request.param == "sqlite":
        return {"data_dir": tmp_path / "data"}
    url = request.getfixturevalue("pg_url")
    _reset_pg(url)
    return {"db_url": url}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(T0)


@pytest.fixture
def make_service(tmp_path: Path, clock: ManualClock) -> Iterator[Callable[..., ControlService]]:
    made: list[ControlService] = []

    def make(**kw: Any) -> ControlService:
        """A service; these tests push hand-built batches and no agent validates, so the gate
        into service (``require_validation``, on by default) is off unless the test's policy
        sets it (`ungated`)."""
        kw.setdefault("data_dir", tmp_path / "data")
        kw["policy"] = ungated(kw.get("policy"))
        svc = ControlService(ServiceConfig(**kw), clock=clock)
        svc.ingest.start()
        made.append(svc)
        return svc

    yield make
    for s in made:
        s.ingest.stop()
        s.engine.dispose()


def ungated(policy: RemediationPolicy | None) -> RemediationPolicy:
    """``policy`` (else the default) with ``require_validation`` false unless it was given."""
    policy = policy or RemediationPolicy()
    if "require_validation" in policy.model_fields_set:
        return policy
    return policy.model_copy(update={"require_validation": False})


def batch(
    node: str,
    seq: int,
    *,
    agent: str | None = None,
    gpus: int = 2,
    t: float = T0,
    k: int = 2,
    findings: list[dict[str, Any]] | None = None,
    devices: bool = True,
    health: int = 0,
    interval: float = 2.0,
) -> dict[str, Any]:
    """A wire batch (dict) with ``gpus`` GPUs x ``k`` samples; utilization = 10*gpu + i."""
    body: dict[str, Any] = {
        "schema_version": 1,
        "node": node,
        "agent_id": agent or f"agent-{node}",
        "seq": seq,
        "sent_at_s": t,
        "heartbeat_interval_s": interval,
        "health": health,
        "samples": [
            {
                "gpu_uuid": f"GPU-{node}-{g}",
                "gpu_index": g,
                "t": [t + i for i in range(k)],
                "fields": {
                    "gpu_util_pct": [10.0 * g + i for i in range(k)],
                    "power_w": [100.0 + g] * k,
                },
            }
            for g in range(gpus)
        ],
        "findings": findings or [],
    }
    if devices:
        body["devices"] = [
            {
                "index": g,
                "uuid": f"GPU-{node}-{g}",
                "info": {
                    "model": "h100-sxm",
                    "name": "NVIDIA H100",
                    "power_limit_enforced_w": 700.0,
                },
            }
            for g in range(gpus)
        ]
    return body


def fail_finding(node: str, code: str = "XID_79", gpu: int = 0) -> dict[str, Any]:
    return {
        "rule": "xid",
        "code": code,
        "severity": 2,
        "component": f"GPU-{node}-{gpu}",
        "message": "GPU has fallen off the bus",
        "action": "drain_and_inspect",
        "sticky": True,
        "gpu_index": gpu,
    }


def push(svc: ControlService, body: dict[str, Any]) -> Any:
    """Ingest one batch in-process through parse + the writer (the HTTP route's path)."""
    from gpufleet.control.ingest.queue import parse_batch
    from gpufleet.control.state.auth import Principal, Role
    from gpufleet.control.state.store import IngestItem

    parsed = parse_batch(json.dumps(body).encode())
    who = Principal(None, "test", Role.AGENT)
    return svc.ingest.submit_sync(IngestItem(parsed.batch, who, svc.clock(), parsed.arrays))


def wait_for(pred: Callable[[], bool], timeout: float = 10.0) -> bool:
    return wait_until(pred, timeout, step_s=0.05)
