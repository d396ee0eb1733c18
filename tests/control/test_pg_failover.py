"""The controller across a PostgreSQL primary switch (issue 29): two real servers, a primary
and its synchronous streaming standby; two controller replicas reach them through one
multi-host URL (``target_session_attrs=read-write``, docs/control-plane.md "PostgreSQL itself
highly available"). The primary is killed (``pg_ctl stop -m immediate``) and the standby
promoted: the replicas reconnect by themselves, one leads again with a larger fencing token,
the leader work both wrote forms one history (every epoch written by one holder, epochs never
going back), and every batch acknowledged before the switch is on the new primary."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, insert, select, text

from gpufleet.control.db.models import EventRow, IngestedBatch, Node
from gpufleet.control.ha.leader import StaleLeader
from gpufleet.control.service import ControlService, ServiceConfig
from gpufleet.testing.timescale import scaled
from tests.control.conftest import batch, push, ungated
from tests.control.pg_pair import Pair, pair  # noqa: F401  (the primary + standby fixture)
from tests.waiting import wait_truthy

pytestmark = pytest.mark.process

LEASE_S = scaled(1.5)


def _wait_for_work(r: ControlService) -> None:
    """Until leader work of ``r``'s current epoch is stored."""

    def stored() -> bool:
        with r.engine.connect() as c:
            q = select(EventRow.message).where(EventRow.kind == "leader_work")
            mark = f"{r.leader.holder} {r.leader.epoch} "
            return any(m.startswith(mark) for m in c.execute(q).scalars())

    wait_truthy(stored, 10, f"leader work of {r.leader.holder}")


def _leading(replicas: list[ControlService]) -> ControlService | None:
    return next((r for r in replicas if r.leader.is_leader), None)


def _port(engine: Engine) -> int:
    with engine.connect() as c:
        return int(c.execute(text("SELECT inet_server_port()")).scalar_one())


def test_replicas_follow_a_promoted_standby_with_one_leader_and_growing_tokens(
    pair: Pair,  # noqa: F811
    tmp_path: Path,
) -> None:
    replicas = [
        ControlService(
            ServiceConfig(
                db_url=pair.url,
                data_dir=tmp_path / name,
                policy=ungated(None),
                lease_s=LEASE_S,
                renew_s=0.2,
            )
        )
        for name in ("a", "b")
    ]
    for r in replicas:
        r.start()
    stop = threading.Event()
    refused: list[str] = []

    def leader_work(r: ControlService) -> None:
        """What the leader's periodic work does: fenced writes, one every 20 ms, naming the
        holder and the epoch the replica believes it holds."""
        n = 0
        while not stop.is_set():
            try:
                with r.leader.fenced() as epoch, r.engine.begin() as c:
                    n += 1
                    c.execute(
                        insert(EventRow).values(
                            at_s=time.time(), kind="leader_work", severity=0,
                            message=f"{r.leader.holder} {epoch} {n}", data={},
                        )
                    )  # fmt: skip
            except StaleLeader as exc:
                refused.append(str(exc))
            except Exception:  # the database away during the switch: the next try reconnects
                pass
            time.sleep(0.02)

    workers = [threading.Thread(target=leader_work, args=(r,), daemon=True) for r in replicas]
    replicas = list(replicas)  # the test stops one of them on the way
    for w in workers:
        w.start()
    try:
        leader = wait_truthy(lambda: _leading(replicas), 10, "a leader")
        assert leader is not None
        first_epoch = leader.leader.epoch
        assert first_epoch is not None
        acks = [push(replicas[i % 2], batch(f"n{i}", 1)) for i in range(10)]
        assert [(a.seq, a.duplicate) for a in acks] == [(1, False)] * 10
        before_port = _port(replicas[0].engine)
        pair.switch()
        # a replica leads on the promoted standby (the old leader keeps its lease when its
        # renewal reaches the new primary in time; else the other takes over past its epoch)
        new = wait_truthy(lambda: _leading(replicas), 30, "a leader after the switch")
        assert new is not None
        assert _port(new.engine) == pair.standby_port != before_port
        _wait_for_work(new)
        # and a change of holder on the new primary: the leader stops, the other takes over
        after = next(r for r in replicas if r is not new)
        new.stop()
        replicas.remove(new)
        wait_truthy(lambda: after.leader.is_leader, 30, "the other replica leads")
        assert after.leader.epoch is not None and after.leader.epoch > first_epoch
        _wait_for_work(after)
    finally:
        stop.set()
        for w in workers:
            w.join(5)
        for r in replicas:
            r.stop()
    eng = create_engine(pair.url)
    try:
        with eng.connect() as c:
            rows = c.execute(
                select(EventRow.message).where(EventRow.kind == "leader_work").order_by(EventRow.id)
            ).scalars()
            history = [(m.split()[0], int(m.split()[1])) for m in rows]
            nodes = set(c.execute(select(Node.name)).scalars())
            stored = c.execute(select(IngestedBatch.agent_id, IngestedBatch.seq)).all()
    finally:
        eng.dispose()
    # one history: epochs never go back, and each epoch was written by one holder only
    epochs = [e for _, e in history]
    assert epochs == sorted(epochs), "leader work of an older epoch after a newer one"
    holders: dict[int, set[str]] = {}
    for h, e in history:
        holders.setdefault(e, set()).add(h)
    assert all(len(h) == 1 for h in holders.values()), holders
    assert max(epochs) > first_epoch and len({h for h, _ in history}) == 2
    # every batch acknowledged before the switch (synchronous standby) registered its node
    assert {f"n{i}" for i in range(10)} <= nodes
    assert {(f"agent-n{i}", 1) for i in range(10)} <= {tuple(r) for r in stored}
