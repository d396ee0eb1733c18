"""The detached unit that runs a site's update command for a maintenance campaign (issue 15):
``python -m gpufleet.agent.update_unit DIR KEY TIMEOUT_S COMMAND``.

It forks once more and the first process exits, so the unit is nobody's child (its parent is
init, or a systemd service of its own when the agent started it with ``systemd-run``) and lives
on when the agent stops or restarts. It runs ``/bin/sh -c COMMAND`` in its own session with a
timeout (the whole process group is killed past it), then writes ``DIR/KEY.result.json``
(0600, written to a temporary name and renamed: a reader never sees half a file): exit code
(None when it timed out or could not start), timed_out, the last lines of its output, start
and end times. The agent reports that file to the controller (`gpufleet.agent.maintenance`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TAIL_BYTES = 4000


def result_path(root: Path, key: str) -> Path:
    return root / f"{key}.result.json"


def write_private(path: Path, doc: dict[str, object]) -> None:
    """``doc`` as JSON at ``path`` (0600), atomically."""
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def run_unit(root: Path, key: str, timeout_s: float, command: str) -> dict[str, object]:
    """Run the command with its timeout; write and return the result."""
    log = root / f"{key}.output"
    started = time.time()
    exit_code: int | None = None
    timed_out = False
    with open(log, "wb") as out:
        os.chmod(log, 0o600)
        try:
            proc = subprocess.Popen(
                ["/bin/sh", "-c", command],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=root,
            )
        except OSError as exc:
            out.write(f"could not start the update command: {exc}\n".encode())
        else:
            try:
                exit_code = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    data = log.read_bytes()[-TAIL_BYTES:]
    doc: dict[str, object] = {
        "key": key,
        "exit_code": exit_code,
        "timed_out": timed_out,
        "output_tail": data.decode("utf-8", "replace").replace("\x00", ""),
        "started_s": started,
        "ended_s": time.time(),
    }
    write_private(result_path(root, key), doc)
    return doc


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print("usage: python -m gpufleet.agent.update_unit DIR KEY TIMEOUT_S COMMAND")
        return 2
    root, key, timeout, command = Path(argv[0]), argv[1], float(argv[2]), argv[3]
    if os.environ.get("GPUFLEET_UPDATE_NO_FORK") != "1" and os.fork() > 0:
        return 0  # the parent returns at once; the child lives on, an orphan
    os.setsid()
    run_unit(root, key, timeout, command)
    return 0


if __name__ == "__main__":
    os._exit(main(sys.argv[1:]))
