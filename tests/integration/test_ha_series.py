"""Any replica answers a node's raw series alike (issue 18), with real processes: two
controller replicas on one real PostgreSQL, each started with ``--advertise-url``, and a
real agent pushing to replica A only.

Replica B, whose memory holds none of the node's samples, forwards the read to A (the node's
row names A as the holder of its rings) and answers exactly A's samples; a token of another
tenant is refused on B as on A; a read carrying the forwarded header is answered from B's own
memory (no forwarding, so no loop); with A killed, B answers 200 from its own (empty) memory
marked ``partial``, naming A, not an error page.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gpufleet.control.series.forward import FORWARDED
from gpufleet.testing.procs import AgentProcess, ControllerProcess, stop_all
from gpufleet.testing.testbed import wait_for
from tests.control.conftest import _reset_pg, pg_url  # noqa: F401  (the PostgreSQL fixture)

pytestmark = [pytest.mark.slow, pytest.mark.process]

NODE = "hs-n1"
SERIES = f"/api/v1/nodes/{NODE}/gpus/0/series"


def _tokens(url: str) -> dict[str, str]:
    """Global admin, tenant t1's agent (bound to the node) and viewer, tenant t2's viewer."""
    import time as _time

    from gpufleet.control.db.engine import make_engine, migrate, session_factory
    from gpufleet.control.state.auth import TokenStore

    engine = make_engine(url)
    try:
        migrate(engine)
        store = TokenStore(session_factory(engine), _time.time)
        made = {
            "admin": store.create("admin", name="hs-admin"),
            "agent": store.create("agent", name="hs-agent", tenant="t1", node=NODE),
            "t1": store.create("viewer", name="hs-t1", tenant="t1"),
            "t2": store.create("viewer", name="hs-t2", tenant="t2"),
        }
        return {k: tok for k, (tok, _row) in made.items()}
    finally:
        engine.dispose()


def get(
    ctl: ControllerProcess, token: str, headers: dict[str, str] | None = None, **params: Any
) -> httpx.Response:
    return httpx.get(
        ctl.url + SERIES,
        params=params,
        headers={"Authorization": f"Bearer {token}", **(headers or {})},
        timeout=10.0,
    )


@pytest.fixture
def two(
    pg_url: str,  # noqa: F811
    tmp_path: Path,
) -> Iterator[tuple[ControllerProcess, ControllerProcess, AgentProcess, dict[str, str]]]:
    _reset_pg(pg_url)
    tokens = _tokens(pg_url)
    ctls = []
    for name in ("a", "b"):
        c = ControllerProcess(tmp_path / name, tokens["admin"], db_url=pg_url, scheduler="none")
        c.args = ["--advertise-url", c.url]
        ctls.append(c)
    for c in ctls:
        c.start()
    a, b = ctls
    agent = AgentProcess(NODE, a.url, tokens["agent"], tmp_path / "agent", push_interval_s=0.25)
    agent.start()
    try:
        yield a, b, agent, tokens
    finally:
        stop_all([agent])
        for c in ctls:
            c.stop()


def test_a_replica_forwards_raw_series_to_the_holder(
    two: tuple[ControllerProcess, ControllerProcess, AgentProcess, dict[str, str]],
) -> None:
    a, b, agent, tokens = two
    admin = tokens["admin"]

    def samples_on_a() -> bool:
        r = get(a, admin, fields=["power_w"])
        return r.status_code == 200 and len(r.json()["t"]) >= 4

    wait_for(samples_on_a, 120.0, "raw samples on replica A", step_s=0.2)
    wait_for(lambda: get(b, admin).status_code == 200, 30.0, "the node known to B", step_s=0.1)
    agent.stop()  # no new samples: both answers describe the same rings
    assert not agent.alive()

    def pair() -> tuple[dict[str, Any], dict[str, Any]] | None:
        """A's answer, B's, and A's again: when A's did not change in between (a batch sent
        just before the agent stopped may still land), B's read the same rings."""
        before, theirs, after = get(a, admin).json(), get(b, admin).json(), get(a, admin).json()
        return (before, theirs) if before == after else None

    mine, theirs = wait_for(pair, 30.0, "A's samples settled", step_s=0.2)
    assert mine["t"], mine
    assert (theirs["t"], theirs["fields"]) == (mine["t"], mine["fields"])  # the same samples
    assert mine["source"] == "memory" and mine["served_by"] == a.url and not mine["partial"]
    assert theirs["source"] == "peer" and theirs["served_by"] == a.url
    assert theirs["partial"] is False and theirs["note"] is None
    # the query goes along: a field selection and since_s
    since = mine["t"][len(mine["t"]) // 2]
    part_a = get(a, admin, fields=["gpu_temp_c"], since_s=since).json()
    part_b = get(b, admin, fields=["gpu_temp_c"], since_s=since).json()
    assert list(part_b["fields"]) == ["gpu_temp_c"] and part_b["t"][0] >= since
    assert (part_b["t"], part_b["fields"]) == (part_a["t"], part_a["fields"])

    # tenants: the node is t1's; t1's viewer reads it through B (the peer checks the token
    # against the same database), t2's viewer is refused on B as on A
    t1 = get(b, tokens["t1"]).json()
    assert t1["source"] == "peer" and t1["t"] == mine["t"]
    refused = [get(c, tokens["t2"]) for c in (a, b)]
    assert [r.status_code for r in refused] == [404, 404]
    assert "t" not in refused[1].json()
    assert get(b, "gf_not_a_token").status_code == 401

    # a GPU the node does not have: the holder's 404 reaches the caller through B, and B
    # does not take the holder for down (before: every chart on B read partial for 5 s)
    ghost = httpx.get(
        b.url + SERIES.replace("/gpus/0/", "/gpus/99/"),
        headers={"Authorization": f"Bearer {admin}"},
        timeout=10.0,
    )
    assert ghost.status_code == 404 and "has no GPU 99" in ghost.json()["detail"], ghost.text
    after_ghost = get(b, admin).json()
    assert after_ghost["source"] == "peer" and after_ghost["partial"] is False, after_ghost

    # a read marked as forwarded is answered from B's own memory: it holds nothing of the node
    local = get(b, admin, headers={FORWARDED: "1"}).json()
    assert local["t"] == [] and local["source"] == "memory" and local["served_by"] == b.url

    # minutes are not forwarded: both read the shared rollup table
    minute = [get(c, admin, resolution="minute").json() for c in (a, b)]
    assert minute[0]["t"] == minute[1]["t"] and minute[1]["source"] == "memory"

    # the holder killed: B answers from its own memory, marked partial, naming the holder
    a.kill9()
    r = get(b, admin)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["t"] == [] and doc["partial"] is True and doc["source"] == "memory"
    assert a.url in doc["note"] and "did not answer" in doc["note"]
    again = get(b, admin).json()  # the holder is remembered as down: no new wait
    assert again["partial"] is True and "s ago" in again["note"]
    log = "".join(p.read_text(errors="replace") for p in b.data_dir.glob("controller-*.log"))
    assert "did not answer a forwarded series read" in log
    assert admin not in log and "Bearer" not in log  # the caller's header is never logged


def test_https_replicas_verify_each_other_with_the_peer_ca(
    pg_url: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replicas serving HTTPS with their own self-signed certificates: one started with
    ``--peer-ca`` (a bundle of both) reads the holder's samples; one without it cannot verify
    the holder and says so (partial, the verification failure in the note), never reading
    over an unverified connection."""
    from tests.integration.test_tls import make_cert

    _reset_pg(pg_url)
    tokens = _tokens(pg_url)
    certs = {n: make_cert(tmp_path, f"ctl-{n}", "IP:127.0.0.1") for n in ("a", "b", "c")}
    bundle = tmp_path / "peers.pem"
    bundle.write_text("".join(c.read_text() for c, _k in certs.values()), encoding="utf-8")
    monkeypatch.setenv("GPUFLEET_CA", str(bundle))  # the agent verifies A with it
    ctls = []
    for name in ("a", "b", "c"):
        c = ControllerProcess(
            tmp_path / name, tokens["admin"], db_url=pg_url, scheduler="none", tls=certs[name]
        )
        c.args = ["--advertise-url", c.url]
        if name != "c":
            c.args += ["--peer-ca", str(bundle)]
        ctls.append(c)
    for c in ctls:
        c.start()
    a, b, c = ctls
    agent = AgentProcess(NODE, a.url, tokens["agent"], tmp_path / "agent", push_interval_s=0.25)
    agent.start()

    def read(ctl: ControllerProcess) -> httpx.Response:
        return httpx.get(
            ctl.url + SERIES,
            params={"fields": ["power_w"]},
            headers={"Authorization": f"Bearer {tokens['admin']}"},
            timeout=10.0,
            verify=ctl.verify(),
        )

    try:

        def through_b() -> dict[str, Any] | None:
            r = read(b)
            doc: dict[str, Any] = r.json()
            return doc if r.status_code == 200 and len(doc["t"]) >= 4 else None

        doc = wait_for(through_b, 120.0, "A's samples read through B over https", step_s=0.3)
        assert doc["source"] == "peer" and doc["served_by"] == a.url and doc["partial"] is False

        def through_c() -> dict[str, Any] | None:
            """C's answer once it knows the node (it re-reads the database every second; under
            load its first answer may still be 404)."""
            r = read(c)
            return r.json() if r.status_code == 200 else None

        refused = wait_for(through_c, 30.0, "C's answer", step_s=0.3)
        assert refused["partial"] is True and refused["source"] == "memory", refused
        assert refused["t"] == [] and a.url in refused["note"]
        assert "CERTIFICATE_VERIFY_FAILED" in refused["note"] or "certificate" in refused["note"]
    finally:
        stop_all([agent])
        for x in ctls:
            x.stop()
