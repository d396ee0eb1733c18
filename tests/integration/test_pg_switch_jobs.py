"""Jobs across a PostgreSQL primary switch (issue 29), with real processes only.

Two real PostgreSQL servers, a primary and its synchronous streaming standby
(`tests.control.pg_pair`), reached through one multi-host URL; two controller replicas
(``python -m gpufleet controller --scheduler embedded``) on that URL, and the real agents of
two simulated nodes of 2 GPUs (``--controller A,B --run-jobs --executor process``): sw-short
with a job lease shorter than the outage, sw-long with one longer. Every job is a shell whose
grandchild appends ``generation node pid time`` lines to its own file until the test opens its
gate, then ``... done time``: what ran when, and where, comes from the jobs' own records, not
the controller's view.

Four jobs run (two per node) and two more wait when the primary is killed
(``pg_ctl stop -m immediate``); sw-long's copies are let finish while the database is away;
the standby is promoted 2 s (scaled) later, longer than the leader's lease and sw-short's job
lease, so sw-short's agent fences its copies and the leader lapses. Asserted: never two
copies of one job alive at once (no two runs' spans overlap; runs told apart by generation and
pid, so two copies of one generation count as two); each job succeeded with exactly one run
that finished (sw-short's fenced copies requeued and finished once elsewhere, sw-long's
finished during the outage counted once, not run again); no job lost, those submitted just
before the kill included, on both replicas; and the leader, sampled on both replicas
throughout: one holder per epoch, epochs never going back between answers strictly ordered in
time, and a larger epoch after the switch than before it. Neither replica logs a traceback.
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine, select

from gpufleet.control.db.models import LeaderLease
from gpufleet.testing.procs import (
    AgentProcess,
    ControllerProcess,
    create_tokens,
    processes_with,
    stop_all,
)
from gpufleet.testing.testbed import wait_for
from gpufleet.testing.timescale import scaled
from tests.control.pg_pair import Pair, pair  # noqa: F401  (the primary + standby fixture)

pytestmark = pytest.mark.process

LEASE_S, RENEW_S = scaled(1.5), scaled(0.3)
# the agents' job leases: sw-short's runs out while the database is away (its copies are
# fenced and requeued), sw-long's outlasts the switch (its copies live through it)
JOB_LEASE_S = {"sw-short": scaled(1.5), "sw-long": scaled(10.0)}
NODES = list(JOB_LEASE_S)
# between the primary's death and the promotion (a failover manager's detection time): the
# database is away longer than the short job lease, counted from the agents' last contact,
# and than the leader's lease: the leader lapses, and leads after the switch by a new epoch
DETECT_S = scaled(2.0)
EVERY_S, MOST_BEATS = 0.1, 600  # a run beats until its gate opens (60 s at most)
# infrastructure faults requeue; the job itself never fails
SPEC: dict[str, Any] = {"max_restarts": 0, "max_requeues": 20}


def run_job(path: Path, gates: Path) -> list[str]:
    """A shell whose grandchild (bash, its own pid) appends ``GENERATION NODE PID TIME`` every
    ``EVERY_S`` to ``path`` until the gate of its node (``gates/NODE``) or ``gates/all``
    exists, then ``GENERATION NODE PID done TIME``; exit 0. The test opens the gates: so
    copies are alive when it kills the primary, whatever the machine's load."""
    q, g = shlex.quote(str(path)), shlex.quote(str(gates))
    me = "$GPUFLEET_GENERATION $GPUFLEET_NODE $$"
    inner = (
        f'LC_ALL=C; i=0; while :; do echo "{me} $EPOCHREALTIME" >> {q}; '
        f'[ -e {g}/"$GPUFLEET_NODE" ] || [ -e {g}/all ] && break; '
        f"i=$((i+1)); [ $i -ge {MOST_BEATS} ] && break; sleep {EVERY_S}; "
        f'done; echo "{me} done $EPOCHREALTIME" >> {q}'
    )
    return ["sh", "-c", f"bash -c {shlex.quote(inner)} & wait"]


Run = tuple[int, str, int]  # generation, node, pid


@dataclass(frozen=True)
class Runs:
    """One job's runs as its file tells them: ``(generation, node, pid) -> (first, last)``
    beat times, and the runs that wrote ``done``."""

    spans: dict[Run, tuple[float, float]]
    done: list[Run]

    def overlapping(self) -> list[tuple[Run, Run]]:
        items = sorted(self.spans.items())
        return [
            (r1, r2)
            for i, (r1, (a1, b1)) in enumerate(items)
            for r2, (a2, b2) in items[i + 1 :]
            if a1 <= b2 and a2 <= b1
        ]


def read_runs(path: Path) -> Runs:
    spans: dict[Run, tuple[float, float]] = {}
    done: list[Run] = []
    if not path.exists():
        return Runs(spans, done)
    for line in path.read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) not in (4, 5) or not (parts[0].isdigit() and parts[2].isdigit()):
            continue  # a line cut by a kill
        run = (int(parts[0]), parts[1], int(parts[2]))
        if parts[3] == "done":
            done.append(run)
        try:
            t = float(parts[-1])
        except ValueError:
            continue
        first, last = spans.get(run, (t, t))
        spans[run] = (min(first, t), max(last, t))
    return Runs(spans, done)


@dataclass(frozen=True)
class Seen:
    """One answer of ``GET /api/v1/leader``: asked at ``sent``, answered by ``got``
    (monotonic), so the replica's state was read somewhere between the two."""

    sent: float
    got: float
    replica: str
    holder: str
    epoch: int | None


class LeaderWatch:
    """Asks both replicas who leads, every 50 ms, on a thread of its own."""

    def __init__(self, ctls: dict[str, ControllerProcess]) -> None:
        self.ctls = ctls
        self.seen: list[Seen] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> LeaderWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        while not self._stop.wait(0.05):
            for name, c in self.ctls.items():
                sent = time.monotonic()
                try:
                    r = c.call("GET", "/api/v1/leader", timeout_s=2.0)
                    doc = r.json() if r.status_code == 200 else None
                except (httpx.HTTPError, ValueError):
                    doc = None
                if doc is not None:
                    epoch = doc["epoch"] if doc["leader"] else None
                    self.seen.append(Seen(sent, time.monotonic(), name, doc["holder"], epoch))

    def leading(self) -> list[Seen]:
        return [s for s in self.seen if s.epoch is not None]


@dataclass
class Rig:
    pair: Pair
    ctls: dict[str, ControllerProcess]
    agents: list[AgentProcess]


@pytest.fixture
def rig(pair: Pair, tmp_path: Path) -> Iterator[Rig]:  # noqa: F811
    wanted: dict[str, tuple[str, str | None]] = {"admin": ("admin", None)}
    wanted.update({n: ("agent", n) for n in NODES})
    tokens = create_tokens(None, wanted, db_url=pair.url)
    args = ["--lease-seconds", f"{LEASE_S:g}", "--renew-seconds", f"{RENEW_S:g}"]
    ctls = {
        name: ControllerProcess(tmp_path / name, tokens["admin"], db_url=pair.url, args=args)
        for name in ("a", "b")
    }
    started = [threading.Thread(target=c.start) for c in ctls.values()]
    for t in started:
        t.start()
    for t in started:
        t.join()
    both = ",".join(c.url for c in ctls.values())
    agents = [
        AgentProcess(n, both, tokens[n], tmp_path / f"agent-{n}", lease_s=JOB_LEASE_S[n]).start()
        for n in NODES
    ]
    try:
        yield Rig(pair, ctls, agents)
    finally:
        stop_all(agents)
        for c in ctls.values():  # both at once, then wait for each
            if c.proc is not None and c.proc.poll() is None:
                c.proc.terminate()
        for c in ctls.values():
            c.stop()


def alive(pid: int) -> bool:
    """Is process ``pid`` alive (not a zombie)?"""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return stat.rsplit(b")", 1)[1].split()[0] != b"Z"


def test_jobs_run_once_across_a_promoted_standby(rig: Rig, tmp_path: Path) -> None:
    a = rig.ctls["a"]
    for n in NODES:
        a.wait_in_service(n, scaled(60.0))
    gates = tmp_path / "gates"
    gates.mkdir()
    watch = LeaderWatch(rig.ctls).start()
    jobs: dict[str, Path] = {}

    def submit(k: int) -> None:
        path = tmp_path / f"runs-{k}"
        jobs[rig.ctls["ab"[k % 2]].submit(f"sw{k}", run_job(path, gates), **SPEC)] = path

    try:
        wait_for(lambda: watch.leading(), scaled(20.0), "a leader")
        for k in range(4):  # the fleet's 4 GPUs: two copies on each node
            submit(k)
        wait_for(
            lambda: all(read_runs(p).spans for p in jobs.values()),
            scaled(30.0),
            "every job's first run writing",
        )
        before = max(s.epoch or 0 for s in watch.leading())
        for k in range(4, 6):  # acknowledged just before the switch (queued): never lost
            submit(k)
        rig.pair.kill_primary()
        (gates / "sw-long").touch()  # sw-long's copies end while the database is away
        time.sleep(DETECT_S)
        promoted_at = time.time()
        rig.pair.promote()
        switched = time.monotonic()
        wait_for(
            lambda: any(s.sent > switched for s in watch.leading()),
            scaled(30.0),
            "a leader after the switch",
        )
        # sw-short's two copies, alive when the primary died
        cut = [(j, r) for j, p in jobs.items() for r in read_runs(p).spans if r[1] == "sw-short"]
        assert len(cut) == 2, cut
        # the short lease ran out: sw-short's agent kills its copies by itself
        wait_for(
            lambda: not any(alive(r[2]) for _, r in cut),
            scaled(30.0),
            "sw-short's copies fenced",
        )
        (gates / "all").touch()  # every copy from now on ends at once
        docs = {j: a.wait_ended(j, scaled(60.0)) for j in jobs}
    finally:
        watch.stop()
    # the jobs' own records: never two copies at once, each finished exactly once
    away = []
    for job, path in jobs.items():
        runs, doc = read_runs(path), docs[job]
        seen = f"{job}: {runs}; the controller says {doc['state']}: {doc['attempts']}"
        assert runs.overlapping() == [], f"two copies alive at once: {seen}"
        assert len(runs.done) == 1, f"finished {len(runs.done)} times: {seen}"
        assert doc["state"] == "succeeded", seen
        ok = [x for x in doc["attempts"] if x["outcome"] == "exit 0"]
        assert len(ok) == 1, seen
        assert runs.done[0][0] == ok[0]["generation"], seen
        away += [r for r in runs.done if r[1] == "sw-long" and runs.spans[r][1] < promoted_at]
    assert not any(processes_with(str(p)) for p in jobs.values()), "a copy still runs"
    # sw-short's copies were fenced (none finished: their jobs finished by a later run), and
    # sw-long's two ended while the database was away and count once
    assert not [(j, r) for j, r in cut if r in read_runs(jobs[j]).done], cut
    assert len(away) == 2, away
    # the switch is told in lines, not tracebacks (docs/control-plane.md)
    for c in rig.ctls.values():
        text = "".join(p.read_text(errors="replace") for p in c.data_dir.glob("controller-*.log"))
        assert "Traceback" not in text, text[max(0, text.find("Traceback") - 500) :][:3000]
    # both replicas answer every job, those acknowledged just before the switch included
    for c in rig.ctls.values():
        listed = {j["id"]: j["state"] for j in c.call("GET", "/api/v1/jobs").json()["jobs"]}
        assert {j: "succeeded" for j in jobs}.items() <= listed.items()
    # the leader: one holder per epoch; between answers strictly ordered in time (one
    # answered before the other was asked) the epoch never goes back
    leading = watch.leading()
    holders: dict[int, set[str]] = {}
    for s in leading:
        holders.setdefault(s.epoch or 0, set()).add(s.holder)
    assert all(len(h) == 1 for h in holders.values()), holders
    by_answer = sorted(leading, key=lambda s: s.got)
    for y in leading:
        earlier = [x.epoch or 0 for x in by_answer if x.got < y.sent]
        assert (y.epoch or 0) >= max(earlier, default=0), (y, max(earlier))
    # the database was away longer than the leader's lease: whoever leads after the switch
    # took the lease anew, past every epoch before it
    after = [s.epoch or 0 for s in leading if s.sent > switched]
    assert after and min(after) > before, (before, sorted(set(after)))
    engine = create_engine(rig.pair.url)
    try:
        with engine.connect() as conn:
            epoch = conn.execute(select(LeaderLease.epoch)).scalar_one()
    finally:
        engine.dispose()
    assert epoch >= max(after)
    spans = {j: sorted(read_runs(p).spans) for j, p in jobs.items()}
    print(f"\nepoch {before} before, {sorted(set(after))} after; runs {spans}")
