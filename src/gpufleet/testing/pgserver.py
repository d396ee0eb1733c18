"""A private PostgreSQL server for benchmarks (Debian's ``postgresql`` package: ``initdb`` and
``pg_ctl`` under ``/usr/lib/postgresql/*/bin``), on a loopback port in a temporary directory,
as the ``postgres`` user (``runuser`` when run as root), removed on exit."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.testing.testbed import free_port


def pg_bindir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


@contextmanager
def private_postgres() -> Iterator[str]:
    """Start one; yields its SQLAlchemy URL (psycopg 3)."""
    bindir = pg_bindir()
    if bindir is None:
        raise GpufleetError("PostgreSQL not found (apt-get install postgresql), or pass --db-url")
    as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    root = Path(tempfile.mkdtemp(prefix="gpufleet-pg-"))
    os.chmod(root, 0o777)  # the postgres user writes its data directory here
    data, port = root / "data", free_port()
    try:
        subprocess.run(
            [*as_pg, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=on"
        ctl = [*as_pg, str(bindir / "pg_ctl"), "-D", str(data), "-w", "-l", str(root / "log")]
        subprocess.run(
            [*ctl, "-o", opts, "start"],
            check=True,
            capture_output=True,
            timeout=120,
        )
        yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*as_pg, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)
