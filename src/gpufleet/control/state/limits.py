"""Per-token resource limits on ingest: how many nodes one agent token that is not bound to a
node may push for. (GPUs per node and samples per batch are limits of the wire contract,
`gpufleet.wire.limits`, checked when a batch is parsed.)

A node-bound token (``gpufleet token create --role agent --node NAME``) pushes for its one
node; an unbound one (bootstrap, `gpufleet sim-fleet`) could otherwise register any number of
nodes, each with its GPUs, and grow the controller's memory without bound. The count is kept in
memory, filled once per token from the batches the database holds for it, and a node is
counted when its first batch is admitted, so concurrent first batches cannot overshoot.
Admin tokens are not limited: they may do everything anyway.
"""

from __future__ import annotations

import asyncio
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI reads the default below at start: keep this module light
    from sqlalchemy.orm import Session, sessionmaker

    from gpufleet.control.state.auth import Principal

DEFAULT_MAX_NODES_PER_TOKEN = 1000


class NodeQuota:
    """Counts the nodes each unbound agent token pushes for and refuses one past ``limit``
    (0: no limit)."""

    def __init__(self, sessions: sessionmaker[Session], limit: int) -> None:
        self._sessions = sessions
        self.limit = limit
        self._nodes: dict[int, set[str]] = {}
        self._lock = threading.Lock()

    def _limited(self, who: Principal) -> bool:
        from gpufleet.control.state.auth import Role

        return (
            self.limit > 0
            and who.role is Role.AGENT
            and who.node is None
            and who.token_id is not None
        )

    def load(self, token_id: int) -> None:
        """Read the nodes this token pushed for from the database (once per token)."""
        from sqlalchemy import select

        from gpufleet.control.db.models import IngestedBatch

        q = select(IngestedBatch.node).where(IngestedBatch.token_id == token_id).distinct()
        with self._sessions() as s:
            nodes = set(s.scalars(q))
        with self._lock:
            self._nodes.setdefault(token_id, set()).update(nodes)

    def admit(self, who: Principal, node: str) -> str | None:
        """None when ``who`` may push for ``node`` (counting it), else why not. The token's
        nodes must be loaded (`load`) first."""
        if not self._limited(who):
            return None
        assert who.token_id is not None
        with self._lock:
            nodes = self._nodes[who.token_id]
            if node in nodes:
                return None
            if len(nodes) >= self.limit:
                return (
                    f"agent token {who.name!r} already pushes for {len(nodes)} nodes, the limit "
                    f"for a token not bound to a node (--max-nodes-per-token {self.limit}); give "
                    "each node its own token: gpufleet token create --role agent --node NAME"
                )
            nodes.add(node)
        return None

    async def check(self, who: Principal, node: str) -> str | None:
        """`admit` from the event loop; the first look at a token reads the database off it."""
        if not self._limited(who):
            return None
        assert who.token_id is not None
        with self._lock:
            loaded = who.token_id in self._nodes
        if not loaded:
            await asyncio.to_thread(self.load, who.token_id)
        return self.admit(who, node)
