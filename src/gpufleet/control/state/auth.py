"""API tokens and roles.

A token is ``gf_`` + 43 random URL-safe characters (256 bits from `secrets`). Only its SHA-256
is stored: with that much entropy a fast hash is enough (a slow KDF defends low-entropy
passwords, not random keys), and lookups stay O(1) on the ingest path. Roles, from most to
least powerful: ``admin`` (everything, tokens and policy), ``operator`` (lifecycle actions,
acknowledge, post validation results), ``viewer`` (read only); ``agent`` tokens may only push
batches, for the node they are bound to (or any node when created without ``--node``, for
bootstrap; only node-bound agent tokens may offer job slots).

A token with a tenant is confined to it (docs/tenants.md has the full matrix): it reads its
tenant's nodes and shared ones (no tenant), writes only its tenant's nodes, jobs, findings and
tokens, and reads only its tenant's audit rows. Only a global admin makes global tokens.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
import threading
from dataclasses import dataclass
from enum import StrEnum

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from gpufleet.control.db.models import ApiToken
from gpufleet.errors import UsageError

log = logging.getLogger("gpufleet.control.auth")

TOKEN_PREFIX = "gf_"
TOKEN_RE = re.compile(r"gf_[A-Za-z0-9_\-]{20,}")


class Role(StrEnum):
    """What a token may do."""

    ADMIN = "admin"
    OPERATOR = "operator"
    VIEWER = "viewer"
    AGENT = "agent"

    @property
    def rank(self) -> int:
        return {"agent": 0, "viewer": 1, "operator": 2, "admin": 3}[self.value]


@dataclass(frozen=True)
class Principal:
    """Who is calling: the token's id, name, role, tenant and (agent tokens) node."""

    token_id: int | None
    name: str
    role: Role
    tenant: str | None = None
    node: str | None = None

    @property
    def actor(self) -> str:
        return f"{self.role.value}:{self.name}"

    def at_least(self, role: Role) -> bool:
        """Human roles form a ladder; agent tokens are outside it (ingest only)."""
        if self.role is Role.AGENT:
            return role is Role.AGENT
        return self.role.rank >= role.rank

    @property
    def is_global(self) -> bool:
        """A token of no tenant: it sees and may touch the whole fleet (as its role allows)."""
        return self.tenant is None

    def sees(self, node_tenant: str | None) -> bool:
        """Reads: a tenant token sees its tenant's nodes and shared ones (no tenant)."""
        return self.tenant is None or node_tenant is None or node_tenant == self.tenant

    def owns(self, node_tenant: str | None) -> bool:
        """Writes: a tenant token changes only its tenant's nodes, never shared ones."""
        return self.tenant is None or node_tenant == self.tenant

    def may_push_for(self, node: str, node_tenant: str | None = None, known: bool = False) -> bool:
        """May this token push batches for ``node`` (``known``: registered, of ``node_tenant``)?
        Agent tokens bound to a node push for that node only; a tenant's agent or admin token
        pushes for its tenant's nodes (and registers new ones, which join its tenant)."""
        if self.role not in (Role.ADMIN, Role.AGENT):
            return False
        if self.node is not None and self.node != node:
            return False
        return not known or self.owns(node_tenant)

    def may_mint(self, tenant: str | None) -> bool:
        """Only a global admin makes global tokens; a tenant admin makes its tenant's only."""
        return self.role is Role.ADMIN and (self.tenant is None or tenant == self.tenant)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def redact(text: str) -> str:
    """Replace anything that looks like a gpufleet token by its first characters and '…'."""
    return TOKEN_RE.sub(lambda m: m.group(0)[:7] + "…", text)


class RedactTokens(logging.Filter):
    """A logging filter that masks tokens in messages and arguments (installed on handlers)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "gf_" in record.msg:
            record.msg = redact(record.msg)
        if record.args and isinstance(record.args, tuple):
            record.args = tuple(
                redact(a) if isinstance(a, str) and "gf_" in a else a for a in record.args
            )
        return True


def install_log_redaction() -> None:
    """Attach the redacting filter to every handler of the root and uvicorn loggers."""
    flt = RedactTokens()
    for name in ("", "uvicorn", "uvicorn.access", "uvicorn.error", "gpufleet"):
        lg = logging.getLogger(name)
        if not any(isinstance(f, RedactTokens) for f in lg.filters):
            lg.addFilter(flt)
        for h in lg.handlers:
            if not any(isinstance(f, RedactTokens) for f in h.filters):
                h.addFilter(flt)


class TokenStore:
    """Create, list, revoke and resolve tokens. Resolutions are cached; a revocation through
    this store drops the cache at once, and `watch` drops it within ``interval_s`` of any change
    to the token table made elsewhere (CLI, other replicas)."""

    def __init__(self, sessions: sessionmaker[Session], clock: object) -> None:
        self._sessions = sessions
        self._clock = clock
        self._cache: dict[str, Principal | None] = {}
        self._lock = threading.Lock()
        # bumped whenever the cache is dropped: a lookup that started before a drop does not
        # store its (possibly stale) answer after it
        self._generation = 0
        self._fingerprint: tuple[object, ...] | None = None
        self._watch_stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def _now(self) -> float:
        return float(self._clock())  # type: ignore[operator]

    def create(
        self,
        role: Role | str,
        *,
        name: str = "",
        tenant: str | None = None,
        node: str | None = None,
        owner: str | None = None,
        session: Session | None = None,
    ) -> tuple[str, ApiToken]:
        """A new token (returned once, in clear) and its stored row."""
        try:
            role = Role(role)
        except ValueError as exc:
            raise UsageError(
                f"--role {role}: expected one of {', '.join(r.value for r in Role)}"
            ) from exc
        if node is not None and role is not Role.AGENT:
            raise UsageError("--node binds an agent token: use it with --role agent")
        token = new_token()
        row = ApiToken(
            # a default name of its own randomness: no part of the secret (names are shown
            # and logged; they once carried 6 characters of the token)
            name=name or f"{role.value}-{secrets.token_hex(3)}",
            prefix=token[:9],
            token_hash=hash_token(token),
            role=role.value,
            tenant=tenant,
            node=node,
            created_s=self._now(),
            owner=owner,
        )
        if session is not None:
            session.add(row)
            session.flush()
        else:
            with self._sessions.begin() as s:
                s.add(row)
                s.flush()
                s.expunge(row)
        return token, row

    def list(self) -> list[ApiToken]:
        with self._sessions() as s:
            return list(s.scalars(select(ApiToken).order_by(ApiToken.id)))

    def revoke(self, token_id: int, session: Session | None = None) -> bool:
        def _do(s: Session) -> bool:
            row = s.get(ApiToken, token_id)
            if row is None or row.revoked_s is not None:
                return False
            row.revoked_s = self._now()
            return True

        if session is not None:
            done = _do(session)
        else:
            with self._sessions.begin() as s:
                done = _do(s)
        self.forget()
        return done

    def forget(self) -> None:
        """Drop every cached resolution (after a revocation commits)."""
        with self._lock:
            self._cache.clear()
            self._generation += 1

    def fingerprint(self) -> tuple[object, ...]:
        """A summary of the token table that changes whenever a token is created, revoked or
        deleted, by this process or any other (the CLI, another controller replica): one small
        aggregate query."""
        q = select(
            func.count(ApiToken.id),
            func.count(ApiToken.revoked_s),
            func.coalesce(func.max(ApiToken.revoked_s), 0.0),
            func.coalesce(func.sum(ApiToken.id), 0),
        )
        with self._sessions() as s:
            return tuple(s.execute(q).one())

    def refresh(self) -> bool:
        """Drop the cache when the token table changed since the last look; True if it did."""
        fp = self.fingerprint()
        if fp == self._fingerprint:
            return False
        self._fingerprint = fp
        self.forget()
        return True

    def watch(self, interval_s: float = 0.1) -> None:
        """Poll the token table every ``interval_s`` from a background thread, so a revocation
        written by anyone reaches this controller's cache within about that time, without a
        database query on each request."""
        if self._watcher is not None:
            return
        self._watch_stop.clear()

        def loop() -> None:
            while not self._watch_stop.wait(interval_s):
                try:
                    self.refresh()
                except Exception as exc:  # database down: drop the cache, look again later
                    log.warning("token table check failed: %s", exc)
                    self._fingerprint = None
                    self.forget()

        self._watcher = threading.Thread(target=loop, name="gpufleet-token-watch", daemon=True)
        self._watcher.start()

    def unwatch(self) -> None:
        self._watch_stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=5)
            self._watcher = None

    def cached(self, token: str) -> tuple[bool, Principal | None]:
        """(known, principal) from the cache alone, without touching the database."""
        if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
            return True, None
        digest = hash_token(token)
        with self._lock:
            if digest in self._cache:
                return True, self._cache[digest]
        return False, None

    def resolve(self, token: str) -> Principal | None:
        """The principal of a bearer token, or None (unknown or revoked)."""
        if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
            return None
        digest = hash_token(token)
        with self._lock:
            if digest in self._cache:
                return self._cache[digest]
            generation = self._generation
        with self._sessions() as s:
            row = s.scalars(select(ApiToken).where(ApiToken.token_hash == digest)).first()
            principal = None
            if row is not None and row.revoked_s is None:
                principal = Principal(row.id, row.name, Role(row.role), row.tenant, row.node)
        with self._lock:
            if generation != self._generation:
                return principal  # the cache was dropped meanwhile: this answer may be stale
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[digest] = principal
        return principal
