"""`gpufleet controller --energy-retention-days N` (issue 16): the leader deletes energy
minutes older than N days and keeps newer ones. A real controller process on SQLite, rows put
in its database beforehand; a bad value is refused naming the option."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.testing.procs import ControllerProcess, create_tokens
from gpufleet.testing.testbed import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.process]

DAY = 86400


def _minutes(db: Path) -> list[int]:
    with sqlite3.connect(db) as c:
        return sorted(r[0] for r in c.execute("SELECT minute_s FROM energy_minutes"))


def _put_minutes(db: Path, *minutes: int) -> None:
    """One GPU's minute at each ``minute_s`` (700 W for 60 s), straight into the database."""
    with sqlite3.connect(db) as c:
        for minute in minutes:
            c.execute(
                "INSERT INTO energy_minutes (node, gpu_index, minute_s, window_j, window_s, "
                "fallback_j, power_j, power_s, idle_j, idle_s) "
                "VALUES ('er-n1', 0, ?, 42000, 60, 0, 42000, 60, 0, 0)",
                (minute,),
            )


def test_minutes_older_than_the_option_are_deleted_newer_kept(tmp_path: Path) -> None:
    data = tmp_path / "ctl"
    tokens = create_tokens(data, {"admin": ("admin", None)})  # creates and migrates the db
    db = data / "gpufleet.db"
    now = int(time.time()) // 60 * 60
    old, recent = now - 3 * DAY, now - DAY // 2  # 3 days and 12 hours ago
    _put_minutes(db, old, recent)
    ctl = ControllerProcess(data, tokens["admin"], scheduler="none")
    ctl.args = ["--energy-retention-days", "1"]
    ctl.start()
    try:
        wait_for(lambda: _minutes(db) == [recent], 60.0, "the 3-day-old minute deleted")
        time.sleep(1.0)
        assert _minutes(db) == [recent]  # the 12-hour-old one stays
    finally:
        ctl.stop()


def test_the_default_keeps_a_three_day_old_minute(tmp_path: Path) -> None:
    """Without the option (400 days) the same old row survives the leader's first passes."""
    data = tmp_path / "ctl"
    tokens = create_tokens(data, {"admin": ("admin", None)})
    db = data / "gpufleet.db"
    old = int(time.time()) // 60 * 60 - 3 * DAY
    _put_minutes(db, old)
    ctl = ControllerProcess(data, tokens["admin"], scheduler="none").start()
    try:
        r = ctl.call("GET", "/api/v1/leader")
        assert r.status_code == 200 and r.json()["leader"] is True
        time.sleep(3.0)  # the first slow pass runs at the first tick
        assert _minutes(db) == [old]
    finally:
        ctl.stop()


@pytest.mark.parametrize("value", ["0", "-3", "soon"])
def test_a_bad_retention_is_refused_naming_the_option(value: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    args = [sys.executable, "-m", "gpufleet", "controller", "--data-dir", str(tmp_path / "d")]
    r = subprocess.run(
        [*args, "--energy-retention-days", value],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "--energy-retention-days" in out and "Traceback" not in out


def test_controller_serve_takes_the_option_too(tmp_path: Path) -> None:
    """``gpufleet controller serve`` is the same command as ``gpufleet controller`` (both build
    one `ServiceConfig` from the same options): the retention it runs with is the option's."""
    from gpufleet.testing.testbed import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_")}
    args = [sys.executable, "-m", "gpufleet", "controller", "serve"]
    args += ["--data-dir", str(tmp_path / "d"), "--port", str(free_port()), "--json"]
    args += ["--scheduler", "none", "--energy-retention-days", "2"]
    proc = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    try:
        assert proc.stdout is not None
        lines = [proc.stdout.readline()]  # the ready document, indented JSON
        while lines[-1] not in ("}\n", ""):
            lines.append(proc.stdout.readline())
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    assert json.loads("".join(lines))["energy_retention_days"] == 2.0, lines
