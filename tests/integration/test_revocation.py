"""A token revoked with `gpufleet token revoke` (the CLI writes the database, not the API)
stops working on every running controller, on SQLite and PostgreSQL: the controllers have the
token cached (the cache has no expiry, so only the token-table watcher can drop it), the CLI
revokes it. On PostgreSQL two real controller processes share the database; SQLite allows one
controller per data directory (its lock refuses a second, checked here too).

How fast (docs/security.md's "within 1 s") is a wall-clock figure: `benchmarks/revocation.py`
measures it with `revocation_delays` below; the test only requires that it happens."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.testing.timescale import scaled
from tests.control.conftest import _reset_pg, pg_url
from tests.integration.processes import GPUFLEET, cli, env_for, start, stop

__all__ = ["pg_url"]  # the private PostgreSQL server fixture, shared with the control tests

pytestmark = [pytest.mark.slow, pytest.mark.process]


@pytest.fixture(params=["sqlite", "postgresql"])
def db_args(request: pytest.FixtureRequest, tmp_path: Path) -> list[str]:
    if request.param == "sqlite":
        return ["--data-dir", str(tmp_path / "data")]
    url = request.getfixturevalue("pg_url")
    _reset_pg(url)
    return ["--db-url", url]


def _status(url: str, token: str) -> int:
    r = httpx.get(f"{url}/api/v1/nodes", headers={"Authorization": f"Bearer {token}"}, timeout=5)
    return r.status_code


def revocation_delays(
    urls: list[str], token: str, revoke: Callable[[], None], give_up_s: float
) -> dict[str, float]:
    """Seconds from ``revoke()`` returning to each controller refusing ``token`` (401); a
    controller still accepting it after ``give_up_s`` is absent from the answer."""
    for url in urls:  # they answer, and so hold the token in their cache
        assert _status(url, token) == 200
        assert _status(url, token) == 200
    revoke()
    revoked_at = time.monotonic()
    refused: dict[str, float] = {}
    while len(refused) < len(urls) and time.monotonic() - revoked_at < give_up_s:
        for url in urls:
            if url not in refused and _status(url, token) == 401:
                refused[url] = time.monotonic() - revoked_at
        time.sleep(0.02)
    return refused


def start_controllers(db_args: list[str], home: Path, count: int, procs: list[Any]) -> list[str]:
    """``count`` controller processes on one database (no scheduler), each appended to
    ``procs`` as it starts (the caller stops them); their URLs. Also used by
    benchmarks/revocation.py."""
    from gpufleet.testing.testbed import free_port

    urls = []
    for _ in range(count):
        args = ["controller", *db_args, "--port", str(free_port()), "--scheduler", "none"]
        proc, info = start([*args, "--json"], home)
        procs.append(proc)
        urls.append(info["url"])
    return urls


def test_cli_revocation_reaches_every_replica(tmp_path: Path, db_args: list[str]) -> None:
    from gpufleet.testing.testbed import free_port

    cli(["controller", "migrate", *db_args], tmp_path)
    made = cli(["token", "create", "--role", "operator", *db_args], tmp_path)
    token, token_id = made["token"], made["id"]
    procs: list[Any] = []
    try:
        sqlite = "--data-dir" in db_args
        urls = start_controllers(db_args, tmp_path, 1 if sqlite else 2, procs)
        if sqlite:  # a second controller on the same SQLite file is refused, clearly
            second = subprocess.run(
                [*GPUFLEET, "controller", *db_args, "--port", str(free_port()), "--json"],
                capture_output=True,
                text=True,
                env=env_for(tmp_path),
                timeout=60,
            )
            assert second.returncode == 2 and "stop it first" in second.stderr, second.stderr
        give_up_s = scaled(10)
        refused = revocation_delays(
            urls,
            token,
            lambda: cli(["token", "revoke", str(token_id), *db_args], tmp_path),
            give_up_s,
        )
        assert set(refused) == set(urls), f"still accepted {give_up_s} s after: {refused}"
        other = cli(["token", "create", "--role", "viewer", *db_args], tmp_path)["token"]
        time.sleep(0.5)
        for url in urls:  # a token made meanwhile works: the replicas still read the table
            assert _status(url, other) == 200
    finally:
        for proc in procs:
            stop(proc, signal.SIGTERM)
