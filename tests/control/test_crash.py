"""`kill -9` of a real controller process in the middle of ingest, then a restart: every
acknowledged batch is there, replays of unacknowledged ones are stored, nothing twice; and
the controller's log never shows a token."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from gpufleet.control.db.engine import database_url, make_engine, migrate
from gpufleet.control.db.models import IngestedBatch
from gpufleet.control.state.store import ControlStore
from tests.control.conftest import batch, free_port, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.process]


def start(data: Path, port: int, log: Path) -> subprocess.Popen[bytes]:
    fh = log.open("ab")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpufleet",
            "controller",
            "--data-dir",
            str(data),
            "--port",
            str(port),
        ],
        stdout=fh,
        stderr=fh,
    )
    ok = wait_for(lambda: _healthy(port), timeout=30)
    assert ok, log.read_text()
    return proc


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_kill9_mid_ingest(tmp_path: Path) -> None:
    data = tmp_path / "data"
    engine = make_engine(database_url(data, None))
    migrate(engine)
    token = ControlStore(engine, clock=time.time).tokens.create("agent")[0]
    engine.dispose()
    port = free_port()
    log = tmp_path / "controller.log"
    proc = start(data, port, log)
    url = f"http://127.0.0.1:{port}/api/v1/ingest"
    h = {"Authorization": f"Bearer {token}"}
    acked: dict[str, set[int]] = {}
    sent: dict[str, int] = {}
    stop = threading.Event()

    def agent(node: str) -> None:
        acked[node] = set()
        seq = 0
        with httpx.Client(timeout=5) as c:
            while not stop.is_set() and seq < 2000:
                seq += 1
                sent[node] = seq
                try:
                    body = batch(node, seq, t=time.time(), devices=seq == 1, k=4)
                    r = c.post(url, json=body, headers=h)
                except httpx.HTTPError:
                    return
                if r.status_code == 200:
                    acked[node].add(seq)

    threads = [threading.Thread(target=agent, args=(f"n{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    assert wait_for(lambda: sum(len(a) for a in acked.values()) >= 40, timeout=30)
    os.kill(proc.pid, signal.SIGKILL)  # in the middle of ingest
    proc.wait(timeout=10)
    stop.set()
    for t in threads:
        t.join(timeout=10)
    before = {n: set(s) for n, s in acked.items()}
    proc = start(data, port, log)
    try:
        dup_of_acked = 0
        with httpx.Client(timeout=10) as c:
            for node, last in sent.items():
                for seq in range(1, last + 1):  # replay everything, acked or not
                    body = batch(node, seq, t=time.time(), devices=seq == 1, k=4)
                    r = c.post(url, json=body, headers=h)
                    assert r.status_code == 200, r.text
                    if seq in before[node]:
                        assert r.json()["duplicate"] is True
                        dup_of_acked += 1
        assert dup_of_acked == sum(len(s) for s in before.values())
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
    engine = make_engine(database_url(data, None))
    with engine.connect() as conn:
        rows = conn.execute(select(IngestedBatch.agent_id, IngestedBatch.seq)).all()
        total = conn.scalar(select(func.count()).select_from(IngestedBatch))
    engine.dispose()
    stored = {(a, s) for a, s in rows}
    expected = {(f"agent-{n}", s) for n, last in sent.items() for s in range(1, last + 1)}
    assert stored == expected and total == len(expected)
    text = log.read_text()
    assert token not in text and token[3:20] not in text
    _ = json
