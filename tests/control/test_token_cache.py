"""The token cache never keeps a revoked token: a revocation that commits while a lookup of the
same token is between its database read and its cache fill leaves nothing cached, and a change
written by another process is seen by `TokenStore.refresh`."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event

from gpufleet.control.db.engine import database_url, make_engine, migrate, session_factory
from gpufleet.control.state.auth import TokenStore


def _store(tmp_path: Path) -> TokenStore:
    engine = make_engine(database_url(tmp_path / "data", None))
    migrate(engine)
    return TokenStore(session_factory(engine), time.time)


def test_a_revoke_racing_a_lookup_leaves_no_stale_entry(tmp_path: Path) -> None:
    store = _store(tmp_path)
    token, row = store.create("operator")
    engine = store._sessions.kw["bind"]
    fired: list[bool] = []

    def revoke_mid_lookup(_c: Any, _cur: Any, statement: str, *_a: Any) -> None:
        if "token_hash" in statement and "SELECT" in statement and not fired:
            fired.append(True)  # the lookup has read the row, not yet filled the cache
            t = threading.Thread(target=store.revoke, args=(row.id,))
            t.start()
            t.join()

    event.listen(engine, "after_cursor_execute", revoke_mid_lookup)
    assert store.resolve(token) is not None  # it read the row before the revoke
    assert fired
    assert store.resolve(token) is None


def test_a_revoke_by_another_process_is_seen_by_refresh(tmp_path: Path) -> None:
    ours, theirs = _store(tmp_path), _store(tmp_path)  # two processes' stores, one database
    token, row = ours.create("viewer")
    ours.refresh()
    assert ours.resolve(token) is not None
    assert ours.refresh() is False  # nothing changed: the cached answer stays
    assert ours.cached(token) == (True, ours.resolve(token))
    assert theirs.revoke(row.id)
    assert ours.refresh() is True
    assert ours.resolve(token) is None
