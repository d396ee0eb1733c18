"""Job specs at rest: sealed with a key file, so a copy of the database does not reveal a job's
``env`` (API keys, tokens) or command line.

The embedded scheduler keeps each job's spec in ``sched_jobs.spec``. With a controller data
directory, that text is written as ``fernet:`` + a Fernet token of the spec's JSON (the
``cryptography`` package's authenticated encryption recipe: AES-128-CBC with PKCS7 padding and
HMAC-SHA256, https://cryptography.io/en/latest/fernet/). The key is ``DATA_DIR/job-env.key``,
made on the controller's first start with ``Fernet.generate_key()`` (from ``os.urandom``) and
mode 0600 in the 0700 data directory. A spec stored before sealing (plain JSON) is still read,
and sealed the next time the job is written. Without the key file the sealed specs cannot be
read back: back it up apart from the database, never next to it.
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken

from gpufleet.errors import ConfigError
from gpufleet.private import private_dir, tighten

KEY_FILE = "job-env.key"
PREFIX = "fernet:"


class SpecSealer:
    """Seals and opens the stored text of job specs with one Fernet key."""

    def __init__(self, key: bytes, where: str = "the key") -> None:
        try:
            self._fernet = Fernet(key)
        except ValueError as exc:
            raise ConfigError(f"{where}: not a Fernet key ({exc})") from exc
        self.where = where

    @classmethod
    def in_dir(cls, directory: Path) -> SpecSealer:
        """The sealer of ``directory/job-env.key``, the file made (0600) when missing."""
        path = private_dir(directory) / KEY_FILE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            tighten(path)  # one made by hand with wider modes
        else:
            with os.fdopen(fd, "wb") as f:
                f.write(Fernet.generate_key() + b"\n")
        try:
            key = path.read_bytes().strip()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the job spec key: {exc}") from exc
        return cls(key, str(path))

    def seal(self, text: str) -> str:
        return PREFIX + self._fernet.encrypt(text.encode("utf-8")).decode("ascii")

    def open(self, stored: str, job: str) -> str:
        """The spec's JSON from its stored text (plain JSON from before sealing passes)."""
        if not stored.startswith(PREFIX):
            return stored
        try:
            return self._fernet.decrypt(stored[len(PREFIX) :].encode("ascii")).decode("utf-8")
        except (InvalidToken, ValueError) as exc:
            raise ConfigError(
                f"job {job}: its stored spec does not open with {self.where} "
                "(the database was sealed with another key file)"
            ) from exc
