"""The systemd service unit text the `config agent-systemd` and `controller-systemd` units share."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path


def service_unit(
    *,
    description: str,
    after: str,
    user: str,
    env_file: str,
    argv: Sequence[str],
    settings: Sequence[str],
    state_dir: str,
) -> str:
    """A unit that runs ``argv`` as ``user`` after ``after`` (and the network), restarted
    always, for multi-user.target. Its environment (secrets) comes from ``env_file``, never the
    command line; ``settings`` are its own [Service] lines (limits, sandboxing); a ``state_dir``
    under /var/lib/ is its StateDirectory, kept 0700; what it creates is private (UMask)."""
    state_name = (
        Path(state_dir).relative_to("/var/lib") if state_dir.startswith("/var/lib/") else None
    )
    lines = [
        "[Unit]",
        f"Description={description}",
        "Wants=network-online.target",
        f"After=network-online.target {after}",
        "",
        "[Service]",
        "Type=simple",
        f"User={user}",
        f"EnvironmentFile=-{env_file}",
        f"ExecStart={' '.join(shlex.quote(a) for a in argv)}",
        "Restart=always",
        "RestartSec=5",
        *settings,
        *([f"StateDirectory={state_name}", "StateDirectoryMode=0700"] if state_name else []),
        "UMask=0077",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ]
    return "\n".join(lines)
