"""Chaos with real processes (issue 15): the controller of a running campaign is killed with
SIGKILL again and again, at seeded random moments (whatever step each node is in, a writer
transaction possibly half done), and started again on the same database. The campaign still
ends with every node updated exactly once (the update script logs each run), every node in
service and uncordoned, no step recorded twice, and capacity never below the floor."""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration import campaigns
from tests.integration.campaigns import SupervisedAgent

NODES = ["k0", "k1", "k2", "k3"]
KILLS = 20  # seeded kill moments in one campaign (kept under 3 minutes)

# agents must stay in contact through 20 controller restarts: run alone (see Makefile)
pytestmark = [pytest.mark.process]


def test_kill9_at_random_steps_resumes_without_doing_anything_twice(tmp_path: Path) -> None:
    rng = random.Random(15)
    ctl, tokens = campaigns.controller(tmp_path, NODES)
    script, log = campaigns.update_script(tmp_path)
    agents = [SupervisedAgent(n, ctl.url, tokens[n], tmp_path / n) for n in NODES]
    seen: list[float] = []
    steps_at_kill: list[list[str]] = []
    try:
        for n in NODES:
            ctl.wait_in_service(n, 120)
        cid = campaigns.start(ctl, campaigns.body(str(script), batch=2, floor=0.5))["id"]

        def status() -> dict[str, Any] | None:
            try:
                doc = campaigns.status(ctl, cid)
            except Exception:
                return None
            frac = doc["capacity"]["in_service_fraction"]
            if frac is not None:
                seen.append(frac)
            return doc

        kills = 0
        deadline = time.monotonic() + 200
        doc = status()
        while time.monotonic() < deadline:
            doc = status()
            if doc is not None and doc["state"] != "running":
                break
            if kills < KILLS:
                time.sleep(rng.uniform(0.5, 4.0))
                if doc is not None:
                    steps_at_kill.append([n["step"] for n in doc["nodes"]])
                ctl.kill9()
                ctl.start()
                kills += 1
            else:
                time.sleep(0.5)
        doc = status()
        assert doc is not None and doc["state"] == "done", (doc, steps_at_kill)
        assert kills >= 5, kills  # the campaign may end before all 20
        assert {n["step"] for n in doc["nodes"]} == {"done"}
        runs = log.read_text(encoding="utf-8").split()
        assert sorted(runs[0::2]) == NODES, runs  # each node's update ran exactly once
        for n in NODES:
            assert ctl.node_state(n) == "in_service"
        nodes = ctl.call("GET", "/api/v1/nodes").json()
        items = nodes["nodes"] if isinstance(nodes, dict) else nodes
        assert not any(item["cordoned"] for item in items), items
        assert min(seen) >= 0.5 - 1e-9
        with sqlite3.connect(ctl.data_dir / "gpufleet.db") as db:
            rows = db.execute("SELECT node, step FROM maint_steps").fetchall()
        assert len(rows) == len(set(rows)) == len(NODES) * 8
    finally:
        for a in agents:
            a.stop()
        ctl.stop()
