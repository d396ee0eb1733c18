"""A primary PostgreSQL server and its synchronous streaming standby, reached through one
multi-host URL (``target_session_attrs=read-write``): the rig of the primary-switch tests
(`tests/control/test_pg_failover.py`, `tests/integration/test_pg_switch_jobs.py`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text

from tests.control.conftest import PgServer, free_port
from tests.waiting import wait_truthy


class Pair:
    """A primary `PgServer` and a streaming standby cloned from it (``pg_basebackup -R``)."""

    def __init__(self) -> None:
        self.primary = PgServer()
        # synchronous: a commit returns once the standby has it, so an acknowledged batch
        # survives the switch (what docs/control-plane.md tells an operator to configure)
        self.primary.start("-c synchronous_standby_names='*'")
        self.standby_data = self.primary.root / "standby"
        self.standby_port = free_port()
        p = self.primary
        p._run("pg_basebackup", "-D", str(self.standby_data), "-R", "-X", "stream",
               "-h", "127.0.0.1", "-p", str(p.port), "-U", "postgres")  # fmt: skip
        opts = f"-p {self.standby_port} -k {p.root} -c listen_addresses=127.0.0.1"
        self._standby("-w", "-t", "60", "-l", str(p.root / "standby.log"), "-o", opts, "start")
        self.url = (
            f"postgresql+psycopg://postgres@/postgres?host=127.0.0.1:{p.port}"
            f"&host=127.0.0.1:{self.standby_port}&target_session_attrs=read-write"
        )

    def _standby(self, *args: str, check: bool = True) -> None:
        self.primary._run("pg_ctl", "-D", str(self.standby_data), *args, check=check)

    def switch(self) -> None:
        """The primary dies; the standby is promoted (what a failover manager does)."""
        self.kill_primary()
        self.promote()

    def kill_primary(self) -> None:
        self.primary.stop("immediate")

    def promote(self) -> None:
        """The standby becomes the primary (what a failover manager does)."""
        self._standby("-w", "promote")

    def remove(self) -> None:
        self._standby("-m", "immediate", "-w", "stop", check=False)
        self.primary.remove()


@pytest.fixture
def pair() -> Iterator[Pair]:
    """A `Pair` whose standby streams synchronously before anything is written."""
    made = Pair()
    try:
        eng = create_engine(made.url.replace(f"&host=127.0.0.1:{made.standby_port}", ""))
        with eng.connect() as c:
            q = text("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'")
            wait_truthy(lambda: c.execute(q).scalar_one(), 30, "standby in sync")
        eng.dispose()
        yield made
    finally:
        made.remove()
