"""A rolling upgrade of two replicas loses no acknowledged batch (issue 29, "Upgrading gpufleet
itself"), with both releases really running: the previous release's controller and agent come
from its own source (tests/fixtures/upgrade/109ee82/gpufleet-src.tar.gz, `tests.upgrade.
previous`), this release's from this tree, all on one real PostgreSQL.

Two replicas of the OLD release share a database the old code migrated (to its head, 0011);
two OLD simulated agents push, one to each (``--controller A,B`` and ``B,A``) through
forwarders that record every answer (`tests.upgrade.acks`). Then, as docs/control-plane.md
"Upgrading gpufleet" says: A is replaced by THIS release (it backs the database up with
pg_dump and migrates it to 0012 under the running old B, which keeps acknowledging batches on
the newer schema); B, stopped, is started once more with the old release, which refuses the
newer database without touching it; B is replaced by this release; one agent is upgraded, the
other stays one release behind. At the end every acknowledged batch is stored, each agent's
stored seqs run 1..N with nothing missing (what is not stored is still in its spool), every
key was acknowledged as new exactly once (the others as duplicates), and the leaders' claims,
in the order the test saw them, never went back in epoch nor gave one epoch two holders.
The replicas run ``--scheduler none``: with the embedded scheduler a follower sends the agents'
jobs reports to the leader, and both agents would push to one replica only.

The old code really runs: the child that makes the tokens (and migrates the new database) says
it imported gpufleet from the unpacked tree and knows the old head, and the database is at the
old head after it; the old replica restarted on 0012 answers in 109ee82's words."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, select, text

from gpufleet.control.db.engine import SCHEMA_HEAD
from gpufleet.control.db.models import IngestedBatch, LeaderLease
from gpufleet.testing.procs import AgentProcess, ControllerProcess, stop_all
from gpufleet.testing.testbed import free_port
from gpufleet.testing.timescale import scaled
from tests.control.conftest import _reset_pg, pg_url  # noqa: F401  (the PostgreSQL fixture)
from tests.integration.processes import GPUFLEET
from tests.upgrade.acks import AckRecorder, Answer
from tests.upgrade.previous import Previous, unpack
from tests.waiting import wait_truthy

pytestmark = pytest.mark.process

REF = "109ee82"
LEASE_S, RENEW_S = scaled(1.5), scaled(0.3)
NODES = ("ru-n1", "ru-n2")


@pytest.fixture(scope="session")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Previous:
    """The previous release, unpacked once per session."""
    return unpack(REF, tmp_path_factory.mktemp(f"gpufleet-{REF}"))


class Claims:
    """Polls every replica's ``GET /api/v1/leader``, one after the other on one thread, so
    the answers are in real-time order: ``(release, holder, epoch)`` of each leading one (the
    release its forwarder names)."""

    def __init__(self, ctls: dict[str, ControllerProcess], recs: dict[str, AckRecorder]) -> None:
        self.ctls, self.recs = ctls, recs
        self.seen: list[tuple[str, str, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def __enter__(self) -> Claims:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _poll(self) -> None:
        admin = next(iter(self.ctls.values())).admin
        # one client: httpx.request would load the CA bundle again for every call
        with httpx.Client(headers={"Authorization": f"Bearer {admin}"}, timeout=2.0) as client:
            while not self._stop.is_set():
                for name in sorted(self.ctls):
                    ctl, release = self.ctls[name], self.recs[name].release
                    try:
                        doc = client.get(ctl.url + "/api/v1/leader").json()
                    except (httpx.HTTPError, ValueError):
                        continue  # replaced or starting
                    if doc.get("leader"):
                        self.seen.append((release, str(doc["holder"]), int(doc["epoch"])))
                time.sleep(0.1)


def acks_of(recs: list[AckRecorder], **match: Any) -> list[Answer]:
    return [a for r in recs for a in r.acked() if all(getattr(a, k) == v for k, v in match.items())]


def wait_acks(
    recs: list[AckRecorder], count: int, what: str, after_s: float = 0.0, **match: Any
) -> None:
    """Until ``recs`` recorded ``count`` acknowledgements matching ``match`` after ``after_s``."""

    def enough() -> bool:
        return len([a for a in acks_of(recs, **match) if a.at_s > after_s]) >= count

    wait_truthy(enough, 30, what)


def revision(url: str) -> str:
    eng = create_engine(url)
    try:
        with eng.connect() as c:
            return str(c.execute(text("SELECT version_num FROM alembic_version")).scalar_one())
    finally:
        eng.dispose()


def spooled(agent: AgentProcess) -> tuple[set[int], int]:
    """The seqs still in the agent's spool and its next seq (agent.json)."""
    doc = json.loads((agent.state_dir / "agent.json").read_text(encoding="utf-8"))
    spool = agent.state_dir / "spool"
    left = {int(p.name.split(".")[0]) for p in spool.glob("*.json.gz")} if spool.exists() else set()
    return left, int(doc["next_seq"])


@pytest.fixture
def fleet(
    pg_url: str,  # noqa: F811
    previous: Previous,
    tmp_path: Path,
) -> Iterator[tuple[dict[str, ControllerProcess], dict[str, AckRecorder], list[AgentProcess]]]:
    _reset_pg(pg_url)
    wanted: dict[str, tuple[str, str | None]] = {"admin": ("admin", None)}
    wanted.update({n: ("agent", n) for n in NODES})
    tokens = previous.create_tokens(pg_url, wanted)
    # the old release's own migrations ran: the database is at ITS head, not this tree's
    assert revision(pg_url) == previous.schema_head != SCHEMA_HEAD
    lease = ["--lease-seconds", f"{LEASE_S:g}", "--renew-seconds", f"{RENEW_S:g}"]
    # --scheduler none: no embedded scheduler, whose followers send jobs reports to the leader,
    # so each replica ingests its own agent's batches; --data-dir: where a replica on
    # PostgreSQL keeps its backups (else the default under HOME)
    ctls = {
        name: ControllerProcess(
            tmp_path / name,
            tokens["admin"],
            scheduler="none",
            db_url=pg_url,
            args=[*lease, "--data-dir", str(tmp_path / name)],
            env={**previous.env(), "HOME": str(tmp_path)},
        )
        for name in ("a", "b")
    }
    recs = {name: AckRecorder(name, c.port, "old").start() for name, c in ctls.items()}
    agents = [
        AgentProcess(
            node,
            f"{recs[first].url},{recs[second].url}",
            tokens[node],
            tmp_path / node,
            fast_interval_s=1.0,
            env={**previous.env(), "HOME": str(tmp_path)},
        )
        for node, (first, second) in zip(NODES, (("a", "b"), ("b", "a")), strict=True)
    ]
    try:
        starting = [threading.Thread(target=c.start) for c in ctls.values()]
        for t in starting:
            t.start()
        for t in starting:
            t.join()
        for c in ctls.values():
            assert c.ready(), f"old replica {c.data_dir.name} did not start"
        for a in agents:
            a.start()
        yield ctls, recs, agents
    finally:
        stop_all(agents)
        for c in ctls.values():
            c.stop()
        for r in recs.values():
            r.stop()


def test_a_rolling_upgrade_of_two_replicas_loses_no_acknowledged_batch(
    fleet: tuple[dict[str, ControllerProcess], dict[str, AckRecorder], list[AgentProcess]],
    previous: Previous,
    pg_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    ctls, recs, agents = fleet
    every = list(recs.values())
    old_a, old_b = ctls["a"], ctls["b"]
    home = {"HOME": str(tmp_path)}

    def replace(old: ControllerProcess) -> ControllerProcess:
        """This release on the old replica's port and data directory (its log numbered on)."""
        return ControllerProcess(
            old.data_dir,
            old.admin,
            port=old.port,
            scheduler="none",
            starts=old.starts,
            db_url=pg_url,
            args=old.args,
            env=home,
        )

    with Claims(ctls, recs) as claims:
        # the old release on both replicas, each acknowledging its agent's batches
        wait_acks([recs["a"]], 3, "old replica a acknowledging", node=NODES[0], release="old")
        wait_acks([recs["b"]], 3, "old replica b acknowledging", node=NODES[1], release="old")

        # 1. A is replaced by this release: it backs the database up and migrates it
        old_a.stop()
        recs["a"].release = "new"
        new_a = ctls["a"] = replace(old_a).start()
        assert revision(pg_url) == SCHEMA_HEAD
        (backup,) = (old_a.data_dir / "backups").iterdir()
        assert backup.name.startswith(f"pre-upgrade-{previous.schema_head}-to-{SCHEMA_HEAD}-")
        migrated_s = time.time()

        # the old B keeps serving on the newer schema: it acknowledges new batches of both
        # agents (agent 1 moved to it while A was away) and answers the API
        for node in NODES:
            what = f"old replica b acknowledging {node} on schema {SCHEMA_HEAD}"
            wait_acks([recs["b"]], 3, what, migrated_s, node=node, release="old")
        r = old_b.call("GET", "/api/v1/nodes")
        assert r.status_code == 200, r.text
        assert {n["name"] for n in r.json()["nodes"]} >= set(NODES), r.text

        # 2. B stopped; the old release started again on the migrated database refuses it in
        # its own words (this release's refusal names both revisions: test_newer_database.py),
        # one line, no traceback, nothing changed
        # (while this release starts on B: the refusal comes before the old one would listen)
        old_b.stop()
        where = ["--port", str(free_port()), "--scheduler", "none"]
        again = subprocess.Popen(
            [*GPUFLEET, "controller", "--db-url", pg_url, *old_b.args, *where],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **old_b.env},
        )
        recs["b"].release = "new"
        new_b = ctls["b"] = replace(old_b).start()
        said, _ = again.communicate(timeout=scaled(60))
        assert again.returncode != 0, said
        refusal = (
            f"error: database migration failed: Can't locate revision identified by '{SCHEMA_HEAD}'"
        )
        assert said.strip() == refusal, said
        assert revision(pg_url) == SCHEMA_HEAD
        assert not (old_b.data_dir / "backups").exists()  # migrated already: no second backup

        # 3. agent 2 upgraded (same state directory: its spool replays; B first in its list, so
        # this release's B ingests too); agent 1 stays one release behind, on A
        upgraded = agents[1]
        upgraded.stop()
        upgraded.env = home
        upgraded.start()
        upgraded_s = time.time()
        wait_acks([recs["a"]], 3, "new a acknowledging", upgraded_s, node=NODES[0], release="new")
        wait_acks([recs["b"]], 3, "new b acknowledging", upgraded_s, node=NODES[1], release="new")
        stop_all(agents)
        new_a.stop()
        new_b.stop()

    # every batch any replica acknowledged is stored, once
    eng = create_engine(pg_url)
    try:
        with eng.connect() as c:
            q = select(IngestedBatch.node, IngestedBatch.agent_id, IngestedBatch.seq)
            stored = [(n, a, s) for n, a, s in c.execute(q)]
            lease = c.execute(select(LeaderLease.holder, LeaderLease.epoch)).one()
    finally:
        eng.dispose()
    # no batch refused (an agent drops a batch answered 4xx) and no replica failed one (500):
    # the only other answers are the forwarders' 502 while a replica was away, or a 503
    answers = [a for r in every for a in r.answers]
    odd = [a for a in answers if a.status not in (200, 502, 503)]
    assert not odd, odd[:5]
    # nor any other request of this release failed; the previous release can answer an agent's
    # validation result 500 (StaleCache, when another replica moved the node: fixed here)
    others = [o for r in every for release, o in r.other if release == "new"]
    assert all(" 502 " in o or " 503 " in o for o in others), others
    acked = [a for r in every for a in r.acked()]
    missing = {a.key for a in acked} - set(stored)
    assert not missing, f"{len(missing)} acknowledged but not stored: {sorted(missing)[:5]}..."
    assert len(stored) == len(set(stored))
    fresh: dict[tuple[str, str, int], list[Answer]] = {}
    for a in acked:
        if not a.duplicate:
            fresh.setdefault(a.key, []).append(a)
    twice = {k: v for k, v in fresh.items() if len(v) > 1}
    assert not twice, f"acknowledged as new more than once: {twice}"
    assert set(fresh) == {a.key for a in acked}

    # per agent: seqs 1..N stored, nothing missing; what is not stored is still spooled
    for agent in agents:
        left, next_seq = spooled(agent)
        mine = sorted(q for n, _, q in stored if n == agent.node)
        assert mine == list(range(1, len(mine) + 1)), f"{agent.node}: gaps in {mine}"
        assert set(mine) | left == set(range(1, next_seq)), (agent.node, left, next_seq)
        by = {a.release for a in acked if a.node == agent.node}
        assert by == {"old", "new"}, (agent.node, by)

    # one leader at a time: epochs never went back, one holder per epoch; both releases led
    seen = claims.seen
    epochs = [e for _, _, e in seen]
    assert epochs == sorted(epochs), f"an epoch went back: {seen}"
    holders: dict[int, set[str]] = {}
    for _, h, e in seen:
        holders.setdefault(e, set()).add(h)
    assert all(len(h) == 1 for h in holders.values()), holders
    releases = [r for r, _, _ in seen]
    assert releases[0] == "old" and releases[-1] == "new", seen
    assert lease.epoch >= max(epochs)
