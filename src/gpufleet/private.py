"""Private state on disk: the directories gpufleet keeps state in are 0700 and the files in them
0600 (database with its WAL, agent state and spool, job logs, token files). They hold API keys
in job environments, agent identities and findings; another local user has no business reading
them. Generated configuration meant for other services (slurm.conf, Prometheus service
discovery) is written elsewhere, with ordinary modes.

Long-running commands also set the process umask to `PRIVATE_UMASK` (the CLI does, library code
does not); the functions here tighten what already exists, so a directory made by an older
version, or by hand, is fixed at the next start.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

PRIVATE_UMASK = 0o077


def _tighten_one(path: Path, st: os.stat_result) -> None:
    if st.st_uid != os.getuid() or not st.st_mode & 0o077:
        return  # not ours to change, or already private
    mode = 0o700 if stat.S_ISDIR(st.st_mode) else stat.S_IMODE(st.st_mode) & 0o700
    # a file that vanished meanwhile, a read-only mount: nothing to protect
    with contextlib.suppress(OSError):
        path.chmod(mode)


def tighten(path: Path, *, recursive: bool = False) -> None:
    """Remove group and other permissions from ``path`` (and, ``recursive``, everything under
    it) where this user owns them; symbolic links are left alone."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        return
    _tighten_one(path, st)
    if recursive and stat.S_ISDIR(st.st_mode):
        for root, dirs, files in os.walk(path):
            for name in (*dirs, *files):
                p = Path(root, name)
                try:
                    sub = p.lstat()
                except FileNotFoundError:
                    continue
                if not stat.S_ISLNK(sub.st_mode):
                    _tighten_one(p, sub)


def private_dir(path: Path) -> Path:
    """``path`` (and missing parents) created, with ``path`` itself 0700."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    tighten(path)
    return path


def private_file(path: Path) -> Path:
    """``path`` created empty with mode 0600 when missing (so whatever opens it next, SQLite
    for one, keeps that mode and gives its side files the same); an existing file is
    tightened."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        tighten(path)
    else:
        os.close(fd)
    return path
