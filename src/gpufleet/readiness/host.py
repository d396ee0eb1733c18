"""The host as the readiness checks see it: a root filesystem and a command runner, both
injectable so that tests read fixture trees and a support bundle can be replayed.

``Host(Path("/"), SystemRunner())`` is the machine itself. ``Host(tree, FileRunner(tree))``
reads a captured or hand-written tree: files under ``tree`` stand for ``/proc``, ``/sys``,
``/etc`` and ``/usr``; a command's output is the file ``tree/.commands/<argv joined by _>``
(for example ``.commands/nvidia-smi_-q``); a missing file is a command that is not installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

Runner = Callable[[Sequence[str]], "str | None"]
"""Runs a command, returns its standard output, or None when it is absent or fails."""

COMMAND_TIMEOUT_S = 10.0


class SystemRunner:
    """Runs commands on this machine, in the C locale, with a timeout; never through a shell."""

    def __call__(self, argv: Sequence[str]) -> str | None:
        exe = shutil.which(argv[0])
        if exe is None:
            return None
        env = {**os.environ, "LC_ALL": "C"}
        try:
            done = subprocess.run(  # fixed argv, never a shell
                [exe, *argv[1:]],
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
                env=env,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout if done.returncode == 0 else None


class FileRunner:
    """Answers commands from files: ``<root>/.commands/<argv joined by _>``."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __call__(self, argv: Sequence[str]) -> str | None:
        name = "_".join(argv).replace("/", "%")
        path = self.root / ".commands" / name
        try:
            return path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return None


@dataclass
class Host:
    """A root filesystem and a runner; every read is relative to ``root``."""

    root: Path = field(default_factory=lambda: Path("/"))
    run: Runner = field(default_factory=SystemRunner)

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def read(self, absolute: str) -> str | None:
        """A file's text, or None when it is absent or unreadable."""
        try:
            return self.path(absolute).read_text(encoding="utf-8", errors="replace")
        except (OSError, ValueError):
            return None

    def exists(self, absolute: str) -> bool:
        return self.path(absolute).exists()

    def listdir(self, absolute: str) -> list[str]:
        """Sorted entry names of a directory; empty when it is absent."""
        try:
            return sorted(os.listdir(self.path(absolute)))
        except OSError:
            return []

    def glob(self, pattern: str) -> list[Path]:
        return sorted(self.root.glob(pattern.lstrip("/")))

    def which(self, tool: str) -> str | None:
        """Where ``tool`` is installed under the root's usual binary directories."""
        for d in ("/usr/bin", "/usr/sbin", "/usr/local/bin", "/bin", "/sbin"):
            if self.path(f"{d}/{tool}").is_file():
                return f"{d}/{tool}"
        return None

    def process_names(self) -> set[str]:
        """``comm`` of every process in ``/proc`` (the kernel truncates it to 15 characters:
        proc(5), /proc/pid/comm)."""
        names: set[str] = set()
        for pid in self.listdir("/proc"):
            if pid.isdigit():
                comm = self.read(f"/proc/{pid}/comm")
                if comm:
                    names.add(comm.strip())
        return names

    def running(self, process: str) -> bool:
        return process[:15] in self.process_names()


def loaded_modules(host: Host) -> dict[str, str] | None:
    """Loaded kernel modules from ``/proc/modules`` (name -> the line), None when unreadable.

    Layout (proc(5), "/proc/modules"; lsmod(8) reads it): one module per line, space-separated
    fields: name, size, reference count, users (comma-terminated, or ``-``), state, address.
    Without it (some containers and sandboxes), the loadable modules of /sys/module: those
    with an ``initstate`` file (sysfs ABI, Documentation/ABI/testing/sysfs-module)."""
    text = host.read("/proc/modules")
    if text is not None:
        return {line.split()[0]: line for line in text.splitlines() if line.split()}
    names = [n for n in host.listdir("/sys/module") if host.exists(f"/sys/module/{n}/initstate")]
    if not host.listdir("/sys/module"):
        return None
    return {n: f"{n} (/sys/module)" for n in names}


_VERSION = re.compile(r"\b(\d{2,4}\.\d{1,3}(?:\.\d{1,3})?)\b")


def kernel_driver_version(host: Host) -> str | None:
    """The loaded NVIDIA kernel module's version: ``/sys/module/nvidia/version`` (sysfs ABI,
    /sys/module/MODULENAME/version), else the ``/proc/driver/nvidia/version`` line
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  <build date>" (the open kernel
    modules say "Open Kernel Module for x86_64")."""
    text = host.read("/sys/module/nvidia/version")
    if text and text.strip():
        return text.strip()
    text = host.read("/proc/driver/nvidia/version")
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            found = _VERSION.search(line.split("Module", 1)[-1])
            return found.group(1) if found else None
    return None


def first_version(text: str | None) -> str | None:
    """The first driver-like version number (``535.104.05``) in a tool's output."""
    if not text:
        return None
    found = _VERSION.search(text)
    return found.group(1) if found else None


def version_tuple(version: str) -> tuple[int, ...]:
    """``"550.54.14"`` -> ``(550, 54, 14)``; non-numeric parts stop the tuple."""
    out: list[int] = []
    for part in version.strip().split("."):
        if not part.isdigit():
            break
        out.append(int(part))
    return tuple(out)
