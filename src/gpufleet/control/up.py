"""The control-plane side of `gpufleet up`: building the service, its session tokens, serving
the app, and the seam where the embedded scheduler plugs in. The agents of `up` (this
machine's GPUs, else a simulated fleet) are real `gpufleet.agent` agents run by
`gpufleet.agent.fleet.FleetDriver`, pushing over loopback HTTP through the same ingest path as
remote agents; the CLI wires the two together.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import uvicorn

from gpufleet.control.api.slow_clients import (
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_MAX_CONNECTIONS,
    guarded_protocol,
)
from gpufleet.control.service import ControlService
from gpufleet.tls import TlsFiles

log = logging.getLogger("gpufleet.up")
DEFAULT_SIM = "4x8xh100-sxm"
# test hook (off by default): seconds `serve` waits before it builds the app, as a loaded
# machine can; tests/integration/test_restart_grace.py restarts a controller with it
API_DELAY_ENV = "GPUFLEET_TEST_API_START_DELAY_S"
DEFAULT_DATA_DIR = Path.home() / ".local" / "share" / "gpufleet"
# seconds requests still running may take after a stop signal (uvicorn then cancels them);
# under systemd's default 90 s TimeoutStopSec, with the service's own stop after it
GRACEFUL_SHUTDOWN_S = 10
FILES_BESIDE_CONNECTIONS = 256  # the database, logs, outgoing HTTP: files besides clients


UP_OWNER = "up"  # the ``owner`` of the tokens `gpufleet up` makes for itself
UP_TOKEN_PREFIX = "up-"  # their names (a label only: ownership is the ``owner`` column)
ADMIN_TOKEN_FILE = "admin.token"  # in the data directory, mode 0600


def revoke_previous_up_tokens(service: ControlService) -> int:
    """Revoke the admin and agent tokens earlier `gpufleet up` runs created (marked
    ``owner="up"``), so a data directory does not collect valid tokens nobody holds any more.
    Tokens made any other way are left alone, whatever their name. Returns how many."""
    n = 0
    for row in service.store.tokens.list():
        if row.revoked_s is None and row.owner == UP_OWNER:
            n += int(service.store.tokens.revoke(row.id))
    return n


def admin_token(service: ControlService, data_dir: Path | None = None) -> str:
    """A fresh admin token for this session (printed once, and written to ``admin.token``
    (0600) in ``data_dir`` for ``--token-file``); earlier `up` tokens are revoked."""
    revoke_previous_up_tokens(service)
    token, _ = service.store.tokens.create(
        "admin", name=f"{UP_TOKEN_PREFIX}{int(time.time())}", owner=UP_OWNER
    )
    if data_dir is not None:
        write_secret(data_dir / ADMIN_TOKEN_FILE, token)
    return token


def node_agent_tokens(service: ControlService, nodes: list[str]) -> dict[str, str]:
    """One agent token bound to each node (owned by `up`), made in one transaction: only a
    node-bound token may offer job slots, so no agent can be handed another node's jobs."""
    out = {}
    with service.store.sessions.begin() as s:
        for node in nodes:
            out[node], _ = service.store.tokens.create(
                "agent",
                name=f"{UP_TOKEN_PREFIX}agent-{node}"[:128],
                node=node,
                owner=UP_OWNER,
                session=s,
            )
    return out


def write_secret(path: Path, text: str) -> None:
    """Write ``text`` to a file only its owner can read (created 0600, never world-readable
    for an instant)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        os.fchmod(f.fileno(), 0o600)
        f.write(text + "\n")


def serve(
    service: ControlService,
    host: str,
    port: int,
    *,
    on_ready: Callable[[], None],
    before_exit: Callable[[], None] | None = None,
    tls: TlsFiles | None = None,
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
) -> None:
    """Run uvicorn on the app until SIGINT or SIGTERM; ``on_ready`` runs once the socket is
    listening, ``before_exit`` (on its own thread) when a stop signal comes, while the server
    still answers (`gpufleet up` lets its agents push their last samples there). A request
    head must be complete within ``header_timeout_s`` and at most ``max_connections`` are
    open at once (`gpufleet.control.api.slow_clients`)."""
    from gpufleet.control.api.app import create_app

    delay = os.environ.get(API_DELAY_ENV)
    if delay:  # test hook only: an app that takes this long to build, as on a loaded machine
        log.warning("test hook active: %s=%s", API_DELAY_ENV, delay)
        time.sleep(float(delay))
    app = create_app(service)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="off",
        # TLS too: each connection is upgraded by the guard from its accept, so a handshake
        # that never ends has the head deadline and counts toward the cap (not uvicorn's ssl=)
        http=guarded_protocol(
            header_timeout_s, max_connections, tls.server_context() if tls is not None else None
        ),
        # after a stop signal, requests still running get this long; then they are cancelled
        # (a client that never ends its request must not hold the stop, and systemd's kill)
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
    )
    _room_for(max_connections)
    server = _Server(config, before_exit, service.closing)

    def on_term(signum: int, frame: object) -> None:
        server.should_exit = True  # also when it comes before uvicorn listens

    # uvicorn re-raises the signal that stopped it once its own shutdown is done: with this
    # handler a SIGTERM ends `run` normally, so the caller stops its agents and the service in
    # order (the default action would kill the process there and then)
    prev = None
    if threading.current_thread() is threading.main_thread():
        prev = signal.signal(signal.SIGTERM, on_term)

    def watch() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            service.store.api_listening()  # agents can reach it from now: their grace starts
            on_ready()

    threading.Thread(target=watch, daemon=True).start()
    try:
        server.run()
    finally:
        if prev is not None:
            signal.signal(signal.SIGTERM, prev)


def _room_for(connections: int) -> None:
    """Raise the soft open-files limit towards the hard one, so the connection cap (not
    ``EMFILE`` on accept) is what bounds clients; a warning when it cannot be raised enough."""
    import resource

    want = connections + FILES_BESIDE_CONNECTIONS
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        except (ValueError, OSError):
            new = soft
        if new < want:
            log.warning(
                "open-files limit %d is below --max-connections %d + %d: raise LimitNOFILE "
                "(systemd) or ulimit -n",
                new,
                connections,
                FILES_BESIDE_CONNECTIONS,
            )


class _Server(uvicorn.Server):
    """uvicorn's server, running a callback on a stop signal before it stops answering."""

    def __init__(
        self,
        config: uvicorn.Config,
        before_exit: Callable[[], None] | None,
        closing: threading.Event | None = None,
    ) -> None:
        super().__init__(config)
        self._before_exit = before_exit
        self._exiting = False
        self._closing = closing

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's shutdown, with ``closing`` set first: the open event streams end within
        their next second instead of holding the shutdown until their clients leave (a
        dashboard left open held a SIGTERM-ed controller for as long as the tab stayed)."""
        if self._closing is not None:
            self._closing.set()
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._before_exit is None or self._exiting or self.should_exit:
            super().handle_exit(sig, frame)  # a second signal: uvicorn's own (forced) exit
            return
        self._exiting = True
        before_exit = self._before_exit

        def run() -> None:
            try:
                before_exit()
            except Exception:
                log.exception("stopping before exit failed")
            finally:
                super(_Server, self).handle_exit(sig, frame)

        threading.Thread(target=run, name="gpufleet-before-exit", daemon=True).start()


GROUP_NAMES = 6  # a transition shared by more nodes than this prints as a count


class StateWatcher:
    """Prints node state changes as they happen (`gpufleet up` without ``--json``), so an
    operator sees new nodes go ``validating -> in_service`` on their own once their agents'
    validation passes, and why a node stays out. Reads the writer's snapshot only (no
    database query); nodes that make the same move in one round print as one line."""

    def __init__(
        self, service: ControlService, emit: Callable[[str], None], every_s: float = 0.5
    ) -> None:
        self.service = service
        self.emit = emit
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: dict[str, str] = {}

    def start(self) -> StateWatcher:
        self._thread = threading.Thread(target=self._run, name="gpufleet-up-states", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.round()
            except Exception:  # printing must never take `up` down
                log.exception("state watcher round failed")

    def round(self) -> list[str]:
        """Print (and return) the lines for what changed since the last round."""
        moves: dict[tuple[str, str], list[tuple[str, str]]] = {}
        for name, nv in self.service.store.view.nodes.items():
            before = self._seen.get(name)
            if before == nv.state:
                continue
            self._seen[name] = nv.state
            moves.setdefault((before or "new", nv.state), []).append((name, nv.state_reason))
        lines = []
        for (before, after), nodes in sorted(moves.items()):
            nodes.sort()
            if len(nodes) > GROUP_NAMES:
                lines.append(f"  {len(nodes)} nodes: {before} -> {after}")
                continue
            for name, reason in nodes:
                why = f" ({reason[:160]})" if reason else ""
                lines.append(f"  {name}: {before} -> {after}{why}")
        for line in lines:
            self.emit(line)
        return lines
