"""How long a token revoked with `gpufleet token revoke` (the CLI writes the database) stays
usable on running controllers: docs/security.md's "within 1 s". One controller on SQLite, or
two replicas sharing ``--db-url``; each round creates a token, has every controller cache it,
revokes it through the CLI and polls until each refuses it (the rig of
`tests/integration/test_revocation.py`). Prints each round's worst delay and the median and
worst over the rounds, with the ratio to one API round trip measured in the same run; asserts
nothing about time.

    .venv/bin/python benchmarks/revocation.py [--rounds 5] [--db-url postgresql+psycopg://...]
"""

from __future__ import annotations

import argparse
import functools
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="revocations to time (default 5)")
    ap.add_argument("--db-url", help="a PostgreSQL URL: two controller replicas share it")
    args = ap.parse_args()
    sys.path[:0] = [str(ROOT), str(ROOT / "src")]
    from tests.integration.processes import cli, stop
    from tests.integration.test_revocation import _status, revocation_delays, start_controllers

    with tempfile.TemporaryDirectory() as d:
        home = Path(d)
        db = ["--db-url", args.db_url] if args.db_url else ["--data-dir", str(home / "data")]
        cli(["controller", "migrate", *db], home)
        procs: list[Any] = []
        try:
            urls = start_controllers(db, home, 2 if args.db_url else 1, procs)
            probe = cli(["token", "create", "--role", "viewer", *db], home)["token"]
            trips = []
            for _ in range(20):
                t0 = time.monotonic()
                _status(urls[0], probe)
                trips.append(time.monotonic() - t0)
            trip = statistics.median(trips)
            worst: list[float] = []
            for n in range(args.rounds):
                made = cli(["token", "create", "--role", "operator", *db], home)
                revoke = functools.partial(cli, ["token", "revoke", str(made["id"]), *db], home)
                delays = revocation_delays(urls, made["token"], revoke, give_up_s=30)
                if set(delays) != set(urls):
                    sys.exit(
                        f"round {n + 1}: still accepted 30 s after the revoke on "
                        f"{sorted(set(urls) - set(delays))}"
                    )
                worst.append(max(delays.values()))
                print(f"round {n + 1}: refused on every controller after {worst[-1]:.3f} s")
        finally:
            for proc in procs:
                stop(proc, signal.SIGTERM)
    med, top = statistics.median(worst), max(worst)
    print(
        f"{len(urls)} controller(s), API round trip {trip * 1000:.1f} ms: revocation median "
        f"{med:.3f} s ({med / trip:.0f}x a round trip), worst {top:.3f} s ({top / trip:.0f}x)"
    )


if __name__ == "__main__":
    main()
