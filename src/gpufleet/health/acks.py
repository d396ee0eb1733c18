"""Acknowledgements of sticky findings, and where they (and the active sticky findings) live.

`FileAckStore` keeps, under a state directory:

- ``health-acks.jsonl``: one JSON object per acknowledgement (append-only log; who, why, when);
- ``health-sticky-<node>.json``: the node's active sticky findings, so a restarted agent or
  the next one-shot ``gpufleet health`` run still reports them until acknowledged.

`MemoryAckStore` keeps the same in memory (tests, simulated runs).
"""

from __future__ import annotations

import json
import os
import re
import uuid as uuidlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from gpufleet.catalog import XidAction
from gpufleet.errors import ConfigError
from gpufleet.health.types import Finding, Severity

ACK_LOG = "health-acks.jsonl"


@dataclass(frozen=True)
class Acknowledgement:
    """An operator's acknowledgement of one sticky finding (``code`` on ``component``).

    ``occurrence`` pins the acknowledged occurrence (None: whatever is active at ``at_s``)."""

    code: str
    component: str
    who: str
    why: str
    at_s: float
    node: str | None = None
    occurrence: str | None = None
    id: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Acknowledgement:
        return cls(
            code=str(d["code"]),
            component=str(d["component"]),
            who=str(d["who"]),
            why=str(d["why"]),
            at_s=float(d["at_s"]),
            node=None if d.get("node") is None else str(d["node"]),
            occurrence=None if d.get("occurrence") is None else str(d["occurrence"]),
            id=str(d.get("id") or ""),
        )


def new_ack_id() -> str:
    return uuidlib.uuid4().hex


def finding_to_dict(f: Finding) -> dict[str, Any]:
    d = asdict(f)
    d["severity"] = f.severity.word
    d["action"] = f.action.value
    return d


def finding_from_dict(d: dict[str, Any]) -> Finding:
    return Finding(
        rule=str(d["rule"]),
        code=str(d["code"]),
        severity=Severity[str(d["severity"]).upper()],
        component=str(d["component"]),
        message=str(d.get("message", "")),
        action=XidAction(d.get("action", "none")),
        evidence=dict(d.get("evidence") or {}),
        sticky=bool(d.get("sticky", False)),
        gpu_index=None if d.get("gpu_index") is None else int(d["gpu_index"]),
        first_seen_s=float(d.get("first_seen_s", 0.0)),
        last_seen_s=float(d.get("last_seen_s", 0.0)),
        occurrence=str(d.get("occurrence", "")),
    )


class AckStore(Protocol):
    """Where acknowledgements and active sticky findings persist."""

    def append(self, ack: Acknowledgement) -> None: ...

    def read_all(self) -> list[Acknowledgement]: ...

    def read_new(self) -> list[Acknowledgement]:
        """Acknowledgements appended since the previous call (by anyone)."""
        ...

    def load_sticky(self, node: str) -> list[Finding]: ...

    def save_sticky(self, node: str, findings: list[Finding]) -> None: ...


class MemoryAckStore:
    """An in-memory store (tests, simulated one-shot runs)."""

    def __init__(self) -> None:
        self.acks: list[Acknowledgement] = []
        self.sticky: dict[str, list[Finding]] = {}
        self._read = 0

    def append(self, ack: Acknowledgement) -> None:
        self.acks.append(ack)

    def read_all(self) -> list[Acknowledgement]:
        return list(self.acks)

    def read_new(self) -> list[Acknowledgement]:
        new = self.acks[self._read :]
        self._read = len(self.acks)
        return list(new)

    def load_sticky(self, node: str) -> list[Finding]:
        return list(self.sticky.get(node, []))

    def save_sticky(self, node: str, findings: list[Finding]) -> None:
        self.sticky[node] = list(findings)


def _safe(node: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", node) or "node"


class FileAckStore:
    """JSON-lines acknowledgement log and per-node sticky files under ``state_dir``."""

    def __init__(self, state_dir: Path | str) -> None:
        self.dir = Path(state_dir)
        self._offset = 0

    @property
    def log_path(self) -> Path:
        return self.dir / ACK_LOG

    def sticky_path(self, node: str) -> Path:
        return self.dir / f"health-sticky-{_safe(node)}.json"

    def _ensure_dir(self) -> None:
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{self.dir}: cannot create the state directory: {exc}") from exc

    def append(self, ack: Acknowledgement) -> None:
        self._ensure_dir()
        line = json.dumps(ack.to_dict(), sort_keys=True) + "\n"
        try:
            with self.log_path.open("a", encoding="utf-8") as fh:
                fh.write(line)
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise ConfigError(f"{self.log_path}: cannot write the ack log: {exc}") from exc

    def _parse(self, text: str, first_line: int) -> list[Acknowledgement]:
        out: list[Acknowledgement] = []
        for n, line in enumerate(text.splitlines(), start=first_line):
            if not line.strip():
                continue
            try:
                out.append(Acknowledgement.from_dict(json.loads(line)))
            except (ValueError, KeyError, TypeError) as exc:
                raise ConfigError(
                    f"{self.log_path}: line {n}: not an acknowledgement: {exc}"
                ) from exc
        return out

    def read_all(self) -> list[Acknowledgement]:
        if not self.log_path.is_file():
            return []
        return self._parse(self.log_path.read_text(encoding="utf-8"), 1)

    def read_new(self) -> list[Acknowledgement]:
        if not self.log_path.is_file():
            return []
        with self.log_path.open("rb") as fh:
            fh.seek(self._offset)
            data = fh.read()
        end = data.rfind(b"\n") + 1  # only whole lines; a half-written one waits
        if end == 0:
            return []
        chunk = data[:end].decode("utf-8")
        self._offset += end
        return self._parse(chunk, 1)

    def load_sticky(self, node: str) -> list[Finding]:
        path = self.sticky_path(node)
        if not path.is_file():
            return []
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            return [finding_from_dict(d) for d in doc.get("findings", [])]
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ConfigError(f"{path}: not a sticky-findings file: {exc}") from exc

    def save_sticky(self, node: str, findings: list[Finding]) -> None:
        self._ensure_dir()
        path = self.sticky_path(node)
        tmp = path.with_suffix(".tmp")
        doc = {"node": node, "findings": [finding_to_dict(f) for f in findings]}
        tmp.write_text(json.dumps(doc, indent=1, sort_keys=True), encoding="utf-8")
        tmp.replace(path)

    def nodes_with_sticky(self) -> dict[str, list[Finding]]:
        """Every node's sticky findings found in the state directory."""
        out: dict[str, list[Finding]] = {}
        for path in sorted(self.dir.glob("health-sticky-*.json")):
            try:
                doc = json.loads(path.read_text(encoding="utf-8"))
                node = str(doc.get("node"))
                out[node] = [finding_from_dict(d) for d in doc.get("findings", [])]
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ConfigError(f"{path}: not a sticky-findings file: {exc}") from exc
        return out


def default_state_dir() -> Path:
    """``$GPUFLEET_STATE_DIR``, else ``/var/lib/gpufleet`` when writable, else
    ``$XDG_STATE_HOME/gpufleet`` (``~/.local/state/gpufleet``)."""
    env = os.environ.get("GPUFLEET_STATE_DIR")
    if env:
        return Path(env)
    system = Path("/var/lib/gpufleet")
    if system.is_dir() and os.access(system, os.W_OK):
        return system
    xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(xdg) / "gpufleet"
