"""The agent's on-disk state: its identity, the next sequence number, and a bounded spool of
batches the control plane has not acknowledged yet.

Layout under the state directory::

    agent.json              {"agent_id": ..., "next_seq": N}   (atomic rename on every change)

``next_seq`` is a reservation: with ``seq_block`` > 1 the state file is rewritten (and fsynced)
once per block of sequence numbers, not once per batch, and a restart continues after the
block (the control plane only needs sequence numbers never to repeat for an agent id; gaps
are fine). Many agents in one process use blocks; the single agent writes every number.
    spool/<seq:012d>.json.gz  one gzip-compressed wire.Batch body per file, replayed in seq order

The spool is bounded by ``max_batches`` (default 2000: at a 5 s push interval, ~2.8 hours of an
unreachable control plane) and ``max_bytes`` (default 64 MiB); when either is exceeded the
oldest batches are deleted and counted in ``dropped``.
"""

from __future__ import annotations

import contextlib
import json
import os
import uuid as uuidlib
from pathlib import Path

from gpufleet.errors import ConfigError
from gpufleet.private import private_dir, tighten

DEFAULT_MAX_BATCHES = 2000
DEFAULT_MAX_BYTES = 64 * 2**20


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # also when a stale temporary file was left with wider modes
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class AgentState:
    """The agent's id and next sequence number, persisted so they survive a restart."""

    def __init__(self, state_dir: Path, node: str, *, seq_block: int = 1) -> None:
        self.path = state_dir / "agent.json"
        self.seq_block = max(1, seq_block)
        private_dir(state_dir)
        tighten(self.path)
        if self.path.exists():
            try:
                doc = json.loads(self.path.read_text(encoding="utf-8"))
                self.agent_id = str(doc["agent_id"])
                self.next_seq = int(doc["next_seq"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(
                    f"{self.path}: not a valid agent state file ({exc})",
                    hint="move it away to start a new agent identity",
                ) from exc
        else:
            self.agent_id = f"{node}-{uuidlib.uuid4().hex[:12]}"
            self.next_seq = 1
            self._save(self.next_seq)
        self._reserved = self.next_seq  # numbers below this are persisted as used

    def _save(self, next_seq: int) -> None:
        doc = {"agent_id": self.agent_id, "next_seq": next_seq}
        _atomic_write(self.path, json.dumps(doc).encode())

    def take_seq(self) -> int:
        """The next sequence number, persisted as used before the caller sends it."""
        seq = self.next_seq
        self.next_seq += 1
        if self.next_seq > self._reserved:
            self._reserved = seq + self.seq_block
            self._save(self._reserved)
        return seq


class Spool:
    """Batches waiting for an acknowledgement, oldest first, bounded (drop-oldest)."""

    def __init__(
        self,
        directory: Path,
        *,
        max_batches: int = DEFAULT_MAX_BATCHES,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> None:
        self.dir = directory
        private_dir(self.dir)
        tighten(self.dir, recursive=True)  # batches an older version spooled world-readable
        self.max_batches = max_batches
        self.max_bytes = max_bytes
        self.dropped = 0
        self._sizes: dict[int, int] = {}
        for p in self.dir.glob("*.json.gz"):
            with contextlib.suppress(ValueError, OSError):
                self._sizes[int(p.name.split(".")[0])] = p.stat().st_size

    def _path(self, seq: int) -> Path:
        return self.dir / f"{seq:012d}.json.gz"

    def __len__(self) -> int:
        return len(self._sizes)

    @property
    def nbytes(self) -> int:
        return sum(self._sizes.values())

    def seqs(self) -> list[int]:
        return sorted(self._sizes)

    def put(self, seq: int, body_gz: bytes) -> None:
        _atomic_write(self._path(seq), body_gz)
        self._sizes[seq] = len(body_gz)
        while len(self._sizes) > self.max_batches or (
            self.nbytes > self.max_bytes and len(self._sizes) > 1
        ):
            self.remove(min(self._sizes))
            self.dropped += 1

    def get(self, seq: int) -> bytes:
        return self._path(seq).read_bytes()

    def remove(self, seq: int) -> None:
        self._sizes.pop(seq, None)
        with contextlib.suppress(FileNotFoundError):
            self._path(seq).unlink()
