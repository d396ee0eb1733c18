"""Raw series reads forwarded to the replica that holds the node's samples (issue 18).

Without ``--prometheus-url`` each controller replica keeps the raw samples it ingested in
memory (rings, `gpufleet.control.state.rings`), and an agent pushes to one replica at a
time. The replica that ingests a node's batch records its own ``--advertise-url`` in the
node's row (``nodes.rings_url``, written with the node's throttled heartbeat write,
`gpufleet.control.ingest.writes`). A raw series read on another replica is forwarded to that
URL: the same path and query, the caller's Authorization header (the peer checks the token
against the same database, so tenant scoping is unchanged; the header is never logged) and
``X-Gpufleet-Forwarded: 1``, on which the peer answers from its own memory (no loops), within
`TIMEOUT_S`. The answer says where it came from (``source``, ``served_by``). A holder that
does not answer, or none recorded, leaves the read to this replica's own memory, marked
``partial`` with a ``note`` saying why; nothing is made up. A holder that failed (no answer, a
5xx or an answer that is no series) is not asked again for `DOWN_S` (a dashboard asks once per
GPU). A 4xx is the holder's answer to this read (no such GPU, a field refused): it is passed
on to the caller with its status (`PeerAnswered`), and the holder stays up.

Minute reads are not forwarded: every replica flushes its closed minutes into the shared
rollup table (merged with the same minute from another replica), and minutes are read from
there, so every replica answers them alike.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from urllib.parse import urlsplit

import httpx
from pydantic import ValidationError
from sqlalchemy import select

from gpufleet.control.db.models import Node
from gpufleet.control.state.store import ControlStore
from gpufleet.errors import UsageError
from gpufleet.tls import client_verify
from gpufleet.wire import views as sc

log = logging.getLogger("gpufleet.control")

FORWARDED = "X-Gpufleet-Forwarded"  # on a forwarded read: answer from your own memory
TIMEOUT_S = 2.0  # a peer's whole answer; a dead process on a live host refuses at once
DOWN_S = 5.0  # a holder that failed is not asked again for this long


def check_advertise_url(url: str) -> str:
    """``url`` (without a trailing slash) when peers can use it as this replica's base URL;
    a clear error naming ``--advertise-url`` otherwise. An IPv6 address written without
    brackets and followed by ``:PORT`` (``http://$(POD_IP):8080`` in Kubernetes) is
    bracketed."""
    what = f"--advertise-url {url!r}"
    parts = urlsplit(url.strip())
    host, _, port = parts.netloc.rpartition(":")
    if host.count(":") >= 2 and "[" not in host and "@" not in host:
        with contextlib.suppress(ValueError):
            ipaddress.IPv6Address(host)
            parts = parts._replace(netloc=f"[{host}]:{port}")
    try:
        parts.port  # noqa: B018  (a port that is not a number raises here)
    except ValueError:
        raise UsageError(f"{what}: the port is not a number in 1-65535") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{what}: expected http(s)://HOST:PORT, as the other replicas reach it")
    if parts.username is not None or parts.password is not None:
        raise UsageError(f"{what}: no user:password (the caller's token is forwarded)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise UsageError(f"{what}: no path, query or fragment (expected http(s)://HOST:PORT)")
    try:
        unspecified = ipaddress.ip_address(parts.hostname).is_unspecified
    except ValueError:
        unspecified = False
    if unspecified:
        raise UsageError(
            f"{what}: {parts.hostname} is where a server listens, not an address peers can "
            "reach; give the address or name the other replicas use"
        )
    return f"{parts.scheme}://{parts.netloc}"


class PeerFailed(Exception):
    """The holder did not give a series (unreachable, slow, a 5xx or a malformed answer)."""


class PeerAnswered(Exception):
    """The holder refused the read itself (a 4xx: no such GPU, a bad field, ...): its status
    and detail, for the caller; the holder is up."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(f"HTTP {status}: {detail}")
        self.status, self.detail = status, detail


def mark(doc: sc.Series, source: str, served_by: str | None, note: str | None = None) -> sc.Series:
    """``doc`` saying where it came from (``note``: partial, and why)."""
    return doc.model_copy(
        update={"source": source, "served_by": served_by, "partial": note is not None, "note": note}
    )


class SeriesForwarder:
    """Answers raw series reads of one replica, from the holder's memory where it is another
    replica (see the module's docstring)."""

    def __init__(
        self,
        own_url: str | None,
        *,
        timeout_s: float = TIMEOUT_S,
        down_s: float = DOWN_S,
        clock: Callable[[], float] = time.monotonic,
        transport: httpx.BaseTransport | None = None,
        ca: Path | None = None,
    ) -> None:
        """``ca``: a PEM bundle (or directory) to verify https peers with (``--peer-ca``);
        default the system trust store."""
        self.own_url = own_url
        self.down_s = down_s
        self.clock = clock
        # https peers: --peer-ca, else the system trust store (OpenSSL reads SSL_CERT_FILE /
        # SSL_CERT_DIR); no proxies from the environment: replicas talk to each other directly
        verify = client_verify(ca, "--peer-ca") if ca is not None else ssl.create_default_context()
        self._client = httpx.Client(
            timeout=timeout_s,
            transport=transport,
            verify=verify,
            trust_env=False,
            follow_redirects=False,
        )
        self._down: dict[str, tuple[float, str]] = {}  # holder: (when it failed, why)
        self._lock = threading.Lock()
        self.forwarded = 0  # reads answered by a peer
        self.failed = 0  # reads a holder did not answer (answered locally, partial)

    def close(self) -> None:
        self._client.close()

    @staticmethod
    def holder(store: ControlStore, node: str) -> str | None:
        """The URL of the replica whose memory holds ``node``'s recent samples (its row,
        fresh: the agent may have moved to another replica a second ago)."""
        with store.sessions() as s:
            url: str | None = s.scalar(select(Node.rings_url).where(Node.name == node))
        return url

    def read(
        self,
        store: ControlStore,
        node: str,
        *,
        path: str,
        query: str,
        headers: Mapping[str, str],
        local: Callable[[], sc.Series],
    ) -> sc.Series:
        """The raw series of ``node`` as the holder answers it, or ``local()`` marked."""
        own = self.own_url
        if headers.get(FORWARDED):  # a peer asks for what this replica's memory holds
            return mark(local(), "memory", own)
        holder = self.holder(store, node)
        if holder is None:
            return mark(
                local(),
                "memory",
                own,
                f"no replica recorded holding node {node}'s recent samples (replicas without "
                "--advertise-url); these are this replica's own",
            )
        if holder == own:
            return mark(local(), "memory", own)
        try:
            got = self._fetch(holder, path, query, headers.get("authorization", ""))
        except PeerFailed as exc:
            self.failed += 1
            return mark(
                local(),
                "memory",
                own,
                f"the replica holding node {node}'s recent samples ({holder}) did not answer "
                f"({exc}); these are this replica's own",
            )
        self.forwarded += 1
        return mark(got, "peer", holder, got.note if got.partial else None)

    def _fetch(self, holder: str, path: str, query: str, authorization: str) -> sc.Series:
        now = self.clock()
        with self._lock:
            down = self._down.get(holder)
        if down is not None and now - down[0] < self.down_s:
            raise PeerFailed(f"{down[1]}, {now - down[0]:.0f} s ago")
        url = f"{holder}{path}" + (f"?{query}" if query else "")
        try:
            r = self._client.get(url, headers={"Authorization": authorization, FORWARDED: "1"})
            if 400 <= r.status_code < 500:
                self._up(holder)
                raise PeerAnswered(r.status_code, _detail(r))
            if r.status_code != 200:
                raise PeerFailed(f"HTTP {r.status_code}")
            try:
                doc = sc.Series.model_validate(r.json())
            except (ValueError, ValidationError):
                raise PeerFailed("its answer is not a series") from None
        except (httpx.HTTPError, PeerFailed) as exc:
            why = str(exc) if isinstance(exc, PeerFailed) else f"{type(exc).__name__}: {exc}"
            why = why[:200]
            with self._lock:
                first = holder not in self._down
                self._down[holder] = (now, why)
            if first:  # once per outage; never the request's headers
                log.warning("replica %s did not answer a forwarded series read: %s", holder, why)
            raise PeerFailed(why) from None
        self._up(holder)
        return doc

    def _up(self, holder: str) -> None:
        with self._lock:
            if self._down.pop(holder, None) is not None:
                log.info("replica %s answers forwarded series reads again", holder)


def _detail(r: httpx.Response) -> str:
    """The ``detail`` of a refusal (FastAPI's error body), else its text, bounded."""
    try:
        detail = r.json().get("detail")
    except (ValueError, AttributeError):
        detail = None
    return (detail if isinstance(detail, str) else r.text or r.reason_phrase)[:500]
