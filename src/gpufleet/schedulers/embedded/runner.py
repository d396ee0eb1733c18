"""The wrapper a local job copy runs under: ``python -m gpufleet.schedulers.embedded.runner DIR --
ARGV...``. It sends the command's stdout and stderr to ``DIR/log`` and writes the exit status to
``DIR/exit`` (atomically, through a temporary file), so whoever asks later learns how it ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


def _write_exit(d: Path, code: int) -> None:
    tmp = d / "exit.tmp"
    tmp.write_text(str(code), encoding="utf-8")
    os.replace(tmp, d / "exit")


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.stderr.write("usage: runner DIR -- COMMAND [ARGS...]\n")
        return 2
    d = Path(argv[0])
    cmd = argv[2:]
    with open(d / "log", "ab", buffering=0) as log:
        try:
            child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        except OSError as exc:
            log.write(f"gpufleet: cannot run {cmd[0]!r}: {exc}\n".encode())
            _write_exit(d, 127)
            return 127

        def forward(signum: int, _frame: object) -> None:
            child.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        code = child.wait()
    # A child killed by signal N reports -N; shells report 128+N (bash(1), "EXIT STATUS").
    _write_exit(d, 128 - code if code < 0 else code)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
