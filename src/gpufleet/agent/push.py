"""Pushing batches to the control plane: ``POST {controller}/api/v1/ingest`` (wire schema v1).

Every batch gets the next persisted sequence number. While the spool is empty a batch is sent
at once; when the control plane is unreachable or answers 5xx/429 (``Retry-After`` honoured),
or while older batches still wait, it goes to the on-disk spool, and the spool is replayed in
sequence order once the control plane answers again. A batch is removed from the spool only
after its ``Ack``, so nothing is sent again after an acknowledgement (a crash between the ack and
the removal resends one batch, which the control plane's (agent_id, seq) check absorbs).
400/413/422 answers reject a batch for good: it is dropped and counted, never retried; but for
one. A 422 whose problem body names ``field: schema_version`` with a
``schema_version_supported`` older than this agent's `SCHEMA_VERSION` says "the control plane is
older than me" (a newer agent before its controller's upgrade): that batch and the ones after it
stay in the spool (its bounds hold: past them the oldest are dropped and counted), one error
line names both schemas, ``gpufleet_agent_control_plane_older`` reads 1 and
``gpufleet_agent_push_schema_refused_total`` counts the refusals, and the spool is retried with
the same full-jitter backoff under a longer cap (`OLDER_BACKOFF_FACTOR` times the usual one: 60 s
at the default 5 s), so once the control plane is upgraded the kept batches arrive, in order.

Retries back off with full jitter: after the n-th failure in a row the next attempt waits a
uniform random time in ``[0, min(MAX_BACKOFF_S, BASE_BACKOFF_S * 2**n))`` (`backoff_s`), so
agents that lost the control plane together do not come back together. The cap is 5 s
(`gpufleet.wire.AGENT_MAX_BACKOFF_S`, which the control plane's restart grace also reads), and
never more than the agent's heartbeat interval (the agent passes ``max_backoff_s``). The agent
replays its spool as soon as the backoff allows (`retry_in_s`), not only at its next push: once
the control plane answers again every agent is back in contact within the cap (at most 5 s),
inside both the restart grace a fresh controller gives every node (the lost threshold plus the
worst retry delay plus one push interval) and the job lease (`gpufleet.agent.jobs`, counted
from the last ``Ack``), so an outage shorter than the lease never loses nodes or makes them
kill their jobs. A ``Retry-After`` from the control plane is honoured as is.
"""

from __future__ import annotations

import email.utils
import gzip
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from gpufleet.agent.spool import AgentState, Spool
from gpufleet.replicas import UNAVAILABLE, Replicas
from gpufleet.wire import AGENT_MAX_BACKOFF_S, AGENT_PUSH_TIMEOUT_S, SCHEMA_VERSION, Ack, Batch
from gpufleet.wire.problems import PROBLEM_FIELD, SCHEMA_SUPPORTED

log = logging.getLogger("gpufleet.agent.push")

INGEST_PATH = "/api/v1/ingest"
BASE_BACKOFF_S = 0.5
MAX_BACKOFF_S = AGENT_MAX_BACKOFF_S  # the cap of the retry wait (see the module docstring)
PERMANENT = frozenset({400, 413, 422})
OLDER_BACKOFF_FACTOR = 12.0  # the retry cap while the control plane is older: 12 x the usual


@dataclass
class PushStats:
    """Counters the agent exports as gpufleet_agent_push_* metrics."""

    sent: int = 0
    acked: int = 0
    duplicates: int = 0
    retryable_failures: int = 0
    rejected: int = 0
    auth_failures: int = 0
    throttled: int = 0  # 429 answers (the control plane sheds load)
    schema_refused: int = 0  # 422s for a wire schema newer than the control plane's (kept)
    errors: int = 0
    last_ack_s: float = 0.0


class _Retry(Exception):
    def __init__(self, reason: str, retry_after_s: float | None = None) -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s


class _Older(_Retry):
    """The control plane refused the batch's wire schema as newer than its own: keep it."""

    def __init__(self, reason: str, theirs: int) -> None:
        super().__init__(reason)
        self.theirs = theirs


class _Reject(Exception):
    pass


def older_schema(resp: httpx.Response) -> int | None:
    """The control plane's wire schema when its answer refuses this agent's as newer (a 422
    whose problem body has ``field: schema_version`` and ``schema_version_supported`` below
    `SCHEMA_VERSION`), else None."""
    if resp.status_code != 422:
        return None
    try:
        doc = resp.json()
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get(PROBLEM_FIELD) != "schema_version":
        return None
    theirs = doc.get(SCHEMA_SUPPORTED)
    if type(theirs) is not int or theirs >= SCHEMA_VERSION:
        return None
    return theirs


def _retry_after(value: str | None, now: float) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError):
        return None
    return max(0.0, when - now)


def backoff_s(
    failures: int,
    rng: Callable[[], float],
    *,
    base_s: float = BASE_BACKOFF_S,
    cap_s: float = MAX_BACKOFF_S,
) -> float:
    """Full jitter: a uniform wait in ``[0, min(cap_s, base_s * 2**failures))``, with ``rng()``
    uniform in ``[0, 1)``; ``failures`` counts the failures in a row before this one."""
    return rng() * min(cap_s, base_s * 2.0 ** min(failures, 62))


def encode(batch: Batch) -> bytes:
    """A batch as its gzip-compressed JSON body."""
    return gzip.compress(batch.model_dump_json().encode(), compresslevel=5)


class Pusher:
    """Sends batches in sequence order, spooling what the control plane has not acknowledged."""

    def __init__(
        self,
        controller: str,
        token: str,
        state: AgentState,
        spool: Spool,
        *,
        transport: httpx.BaseTransport | None = None,
        timeout_s: float = AGENT_PUSH_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        client: httpx.Client | None = None,
        max_backoff_s: float = MAX_BACKOFF_S,
    ) -> None:
        """``client``: an HTTP client shared by many agents in one process (not closed here);
        else the pusher makes its own over ``transport``."""
        self.replicas = Replicas(controller)  # ``URL1,URL2``: fail over between replicas
        self.state = state
        self.spool = spool
        self.clock = clock
        self.rng = rng
        self.max_backoff_s = max_backoff_s
        self.stats = PushStats()
        self.on_ack: Callable[[Ack], None] | None = None  # job commands, acks (Agent.on_ack)
        self.retry_at = 0.0
        self.failures = 0  # retryable failures in a row (the backoff exponent)
        # the wire schema of a control plane that refuses ours as newer; None: not refused
        self.older_control_plane: int | None = None
        self._headers = {
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Content-Encoding": "gzip",
            "User-Agent": "gpufleet-agent",
        }
        self._owns_client = client is None
        self._client = client or httpx.Client(transport=transport, timeout=timeout_s)

    @property
    def url(self) -> str:
        """The ingest URL of the replica that answered last."""
        return self.replicas.base + INGEST_PATH

    @property
    def base_url(self) -> str:
        """The replica that answered last (the validation gate posts there too)."""
        return self.replicas.base

    @property
    def client(self) -> httpx.Client:
        """The HTTP client batches go through (the validation gate posts through it too)."""
        return self._client

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    # ----- one push cycle --------------------------------------------------------------------
    def push(self, build: Callable[[int], Batch]) -> None:
        """Build the next batch (``build(seq)``), send or spool it, then replay the spool."""
        now = self.clock()
        seq = self.state.take_seq()
        batch = build(seq)
        if len(self.spool) == 0 and now >= self.retry_at:
            try:
                self._send(seq, encode(batch))
                return
            except _Retry as exc:
                self._defer(now, exc)
            except _Reject as exc:
                self._rejected(seq, exc)
                return
        self.spool.put(seq, encode(batch.model_copy(update={"buffered": True})))
        self.replay()

    def retry_in_s(self) -> float | None:
        """Seconds until spooled batches may be sent again (0: now); None when none wait."""
        if len(self.spool) == 0:
            return None
        return max(0.0, self.retry_at - self.clock())

    def replay(self) -> int:
        """Send spooled batches, oldest first, until one fails; returns how many were acked."""
        now = self.clock()
        done = 0
        if now < self.retry_at:
            return 0
        for seq in self.spool.seqs():
            try:
                self._send(seq, self.spool.get(seq))
            except _Retry as exc:
                self._defer(now, exc)
                break
            except _Reject as exc:
                self._rejected(seq, exc)
            except OSError as exc:  # unreadable spool file: drop it, keep going
                self.stats.errors += 1
                log.error("spooled batch %d unreadable: %s", seq, exc)
            self.spool.remove(seq)
            done += 1
        return done

    # ----- one request -----------------------------------------------------------------------
    def _post(self, body: bytes) -> httpx.Response:
        """POST to the replica that answered last, then to the others in turn while one cannot
        be reached or answers 502/503/504; the last failure when none answers."""
        failure: _Retry | None = None
        for i in self.replicas.order():
            url = self.replicas.urls[i] + INGEST_PATH
            try:
                resp = self._client.post(url, content=body, headers=self._headers)
            except httpx.HTTPError as exc:
                failure = _Retry(f"{url}: {type(exc).__name__}: {exc}")
                continue
            if resp.status_code in UNAVAILABLE and len(self.replicas.urls) > 1:
                failure = _Retry(f"{url}: HTTP {resp.status_code}")
                continue
            if i != self.replicas.active:
                log.warning(
                    "control plane replica %s answers; pushing there", self.replicas.urls[i]
                )
            self.replicas.answered(i)
            return resp
        assert failure is not None  # the loop returns unless every replica failed
        raise failure

    def _send(self, seq: int, body: bytes) -> None:
        self.stats.sent += 1
        resp = self._post(body)
        code = resp.status_code
        if code == 200:
            try:
                ack = Ack.model_validate_json(resp.content)
            except ValueError as exc:
                raise _Retry(f"unreadable Ack: {exc}") from exc
            if ack.seq != seq:
                raise _Retry(f"Ack for seq {ack.seq}, expected {seq}")
            self.stats.acked += 1
            self.stats.duplicates += int(ack.duplicate)
            self.stats.last_ack_s = self.clock()
            self.failures = 0
            self.retry_at = 0.0
            if self.older_control_plane is not None:
                log.warning(
                    "the control plane accepts this agent's wire schema (%d) now: delivering "
                    "the %d kept batch(es) in order",
                    SCHEMA_VERSION,
                    len(self.spool),
                )
                self.older_control_plane = None
            if self.on_ack is not None:
                try:
                    self.on_ack(ack)
                except Exception:  # what it asks must not make the batch be sent again
                    log.exception("applying the Ack's commands or acknowledgements failed")
            return
        theirs = older_schema(resp)
        if theirs is not None:
            self.stats.schema_refused += 1
            raise _Older(f"HTTP {code}: {resp.text[:200]}", theirs)
        if code in PERMANENT:
            raise _Reject(f"HTTP {code}: {resp.text[:200]}")
        if code in (401, 403):
            self.stats.auth_failures += 1
            raise _Retry(f"HTTP {code}: the control plane refused the agent token")
        if code == 429:
            self.stats.throttled += 1
        raise _Retry(f"HTTP {code}", _retry_after(resp.headers.get("Retry-After"), self.clock()))

    def _defer(self, now: float, exc: _Retry) -> None:
        self.stats.retryable_failures += 1
        cap = self.max_backoff_s
        if isinstance(exc, _Older):
            cap *= OLDER_BACKOFF_FACTOR
        if exc.retry_after_s is not None:
            wait = exc.retry_after_s
        else:
            wait = backoff_s(self.failures, self.rng, cap_s=cap)
        self.failures += 1
        self.retry_at = now + wait
        if not isinstance(exc, _Older):
            log.warning("push deferred %.1f s: %s", wait, exc)
        elif self.older_control_plane != exc.theirs:  # one line, not one per batch or retry
            self.older_control_plane = exc.theirs
            log.error(
                "the control plane speaks wire schema %d, this agent %d: upgrade the control "
                "plane. Batches are kept in the spool (at most %d or %d MiB, then the oldest "
                "are dropped and counted) and retried every %.1f s at most",
                exc.theirs,
                SCHEMA_VERSION,
                self.spool.max_batches,
                self.spool.max_bytes // 2**20,
                cap,
            )

    def _rejected(self, seq: int, exc: _Reject) -> None:
        self.stats.rejected += 1
        log.error("batch %d rejected by the control plane, dropped: %s", seq, exc)
